"""cross_entropy and nll_loss as torch's: ignore_index (mean over the labels kept) and
spatial targets ([N, C, d1, ...] scores, [N, d1, ...] labels), values and gradients."""

import numpy as np
import pytest
from torch_semantics import check

import ember as em
from ember import nn

F = nn.functional
torch = pytest.importorskip("torch")
TF = torch.nn.functional
BACKENDS = ["interpreter", "cpu"]
W = np.array([0.5, 2.0, 1.0, 3.0], np.float32)


def _labels(shape, ignored: int | None = -100) -> np.ndarray:
    """Labels in [0, 4) with every third one `ignored` (none when None)."""
    y = np.random.default_rng(2).integers(0, 4, shape)
    if ignored is not None:
        y.flat[::3] = ignored
    return y


CASES = {  # name: (ember, torch, input shape, labels)
    "ce ignore": (lambda x, y: F.cross_entropy(x, y), TF.cross_entropy, (6, 4), _labels(6)),
    "ce ignore in range": (lambda x, y: F.cross_entropy(x, y, ignore_index=1),
                           lambda x, y: TF.cross_entropy(x, y, ignore_index=1), (6, 4),
                           _labels(6, 1)),
    "ce ignore weight": (lambda x, y: F.cross_entropy(x, y, weight=W),
                         lambda x, y: TF.cross_entropy(x, y, weight=torch.tensor(W)), (6, 4),
                         _labels(6)),
    "ce ignore none": (lambda x, y: F.cross_entropy(x, y, reduction="none"),
                       lambda x, y: TF.cross_entropy(x, y, reduction="none"), (6, 4),
                       _labels(6)),
    "ce ignore smoothing": (lambda x, y: F.cross_entropy(x, y, 0.2),
                            lambda x, y: TF.cross_entropy(x, y, label_smoothing=0.2), (6, 4),
                            _labels(6)),
    "ce spatial": (lambda x, y: F.cross_entropy(x, y), TF.cross_entropy, (2, 4, 3, 5),
                   _labels((2, 3, 5), None)),
    "ce spatial ignore weight sum": (
        lambda x, y: F.cross_entropy(x, y, weight=W, reduction="sum"),
        lambda x, y: TF.cross_entropy(x, y, weight=torch.tensor(W), reduction="sum"),
        (2, 4, 3), _labels((2, 3))),
    "ce spatial none": (lambda x, y: F.cross_entropy(x, y, reduction="none"),
                        lambda x, y: TF.cross_entropy(x, y, reduction="none"), (2, 4, 3, 2),
                        _labels((2, 3, 2))),
    "nll ignore": (lambda x, y: F.nll_loss(x, y), TF.nll_loss, (6, 4), _labels(6)),
    "nll spatial ignore weight": (lambda x, y: F.nll_loss(x, y, weight=W, ignore_index=2),
                                  lambda x, y: TF.nll_loss(x, y, weight=torch.tensor(W),
                                                           ignore_index=2),
                                  (2, 4, 5), _labels((2, 5), 2)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", CASES)
def test_class_losses_match_torch(name, backend):
    ours, theirs, shape, y = CASES[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    check(ours, theirs, x, y, backend=backend)


def test_spatial_probability_targets_match_torch():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    p = rng.dirichlet(np.ones(4), (2, 3)).transpose(0, 2, 1).astype(np.float32)
    check(F.cross_entropy, TF.cross_entropy, x, p, backend="cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_in_range_ignore_index_applies_to_input_labels(backend):
    """Labels that are a graph input, ignore_index one of the classes: masked at run time."""
    em.seed(0)
    model = nn.Linear(3, 4)
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    y = np.array([0, 1, 2, 3, 1, 1])
    grads = em.compile_grad(model, lambda o, t: F.cross_entropy(o, t, ignore_index=1),
                            backend=backend)(x, y)
    w = torch.tensor(model.weight.val(), requires_grad=True)
    b = torch.tensor(model.bias.val())
    loss = TF.cross_entropy(torch.tensor(x) @ w + b, torch.tensor(y), ignore_index=1)
    loss.backward()
    np.testing.assert_allclose(grads[model.weight.id], w.grad.numpy(), atol=1e-6)


def test_mismatched_spatial_labels_name_both_shapes():
    x, y = np.zeros((2, 4, 3), np.float32), np.zeros((2, 4), np.int64)
    with pytest.raises(em.ShapeError, match=r"cross_entropy: input \[2, 4, 3\] and target "
                                            r"\[2, 4\] disagree"):
        check(F.cross_entropy, TF.cross_entropy, x, y, backend="interpreter")
