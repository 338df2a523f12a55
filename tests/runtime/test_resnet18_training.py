"""A ResNet-18 written in ember's API (tests/resnet18.py with the CIFAR stem) trains as its
PyTorch twin does: the same weights (`em.load_torch`), batch statistics in BatchNorm, SGD
with momentum, 20 steps on the cpu backend (its convs as Winograd, implicit GEMMs and
pointwise GEMMs), each loss within 1e-4 of PyTorch's (measured: 7e-6; PyTorch float32's
own losses are 1.2e-5 from float64's).

The network is the smooth one (SiLU), as in the gradient tests: with ReLU both float32
runs leave float64's trajectory by 1e-4 to 1e-3 in 20 steps (a pre-activation within
rounding of 0 takes either side, and momentum carries the difference on), ember's as
PyTorch's, so no two float32 implementations agree to 1e-4 there."""

from __future__ import annotations

import numpy as np
import pytest
from resnet18 import ResNet18, torch_resnet18

import ember as em
from ember import nn, optim

torch = pytest.importorskip("torch")

STEPS, LR, MOMENTUM, BATCH = 20, 0.01, 0.9, 16


def test_resnet18_trains_to_pytorchs_losses():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, BATCH)
    torch.manual_seed(0)
    reference = torch_resnet18("cifar")
    model = ResNet18("cifar")
    em.load_torch(model, reference.state_dict())
    step = em.compile_train_step(model, nn.functional.cross_entropy,
                                 optim.SGD(lr=LR, momentum=MOMENTUM), backend="cpu")
    got = [float(step(x, y)) for _ in range(STEPS)]

    sgd = torch.optim.SGD(reference.parameters(), lr=LR, momentum=MOMENTUM)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    want = []
    for _ in range(STEPS):
        sgd.zero_grad()
        loss = torch.nn.functional.cross_entropy(reference(tx), ty)
        loss.backward()
        sgd.step()
        want.append(loss.item())
    assert got[-1] < 0.5 * got[0]  # it learns the batch
    np.testing.assert_allclose(got, want, rtol=1e-4)
