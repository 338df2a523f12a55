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
@pytest.mark.parametrize(("ignore", "labels", "extra"), [
    (1, [0, 1, 2, 3, 1, 1], {}),  # one of the classes
    (-100, [0, -100, 2, 3, -100, 1], {}),  # torch's default, outside the classes
    (-100, [0, -100, 2, 3, -100, 1], {"weight": W}),  # the decomposed path (one_hot)
])
def test_ignore_index_applies_to_input_labels(backend, ignore, labels, extra):
    """Labels that are a graph input: the ignored value passes the runtime's label check
    (natively on cpu) and those rows drop out of the mean, as in torch."""
    em.seed(0)
    model = nn.Linear(3, 4)
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    y = np.array(labels)
    grad = em.compile_grad(model, lambda o, t: F.cross_entropy(o, t, ignore_index=ignore,
                                                               **extra), backend=backend)
    grads = grad(x, y)
    w = torch.tensor(model.weight.val(), requires_grad=True)
    b = torch.tensor(model.bias.val())
    weight = {"weight": torch.tensor(W)} if extra else {}
    loss = TF.cross_entropy(torch.tensor(x) @ w + b, torch.tensor(y), ignore_index=ignore,
                            **weight)
    loss.backward()
    assert abs(grad.loss - loss.item()) < 1e-6
    np.testing.assert_allclose(grads[model.weight.id], w.grad.numpy(), atol=1e-6)
    y[0] = -1  # any other out-of-range label is still refused, naming what is allowed
    with pytest.raises(ValueError, match=rf"values \[-1\] outside \[0, 4\) or {ignore} "
                                         r"\(ignore_index\)"):
        grad(x, y)


def test_the_cross_entropy_gradient_rule_skips_ignored_rows():
    """autodiff before decompose uses nn.cross_entropy's own rule: the same gradients."""
    from ember.backends import interpreter
    from ember.frontend.trace import trace_function
    from ember.passes.manager import PassManager, parse_pipeline

    em.seed(0)
    model = nn.Linear(3, 4)
    x = np.random.default_rng(0).standard_normal((6, 3)).astype(np.float32)
    y = np.array([0, -100, 2, 3, -100, 1])
    values = {str(p.id): p.val() for _, p in model.all_params()}

    def run(order: str) -> list:
        graph = trace_function(lambda a, t: F.cross_entropy(model(a), t), model, (x, y),
                               training=True)
        return interpreter.run(PassManager(parse_pipeline(order)).run(graph), [x, y], values)

    runs = [run(order) for order in ("decompose,autodiff", "autodiff,decompose")]
    assert len(runs[0]) == 3  # the loss and two gradients
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_mismatched_spatial_labels_name_both_shapes():
    x, y = np.zeros((2, 4, 3), np.float32), np.zeros((2, 4), np.int64)
    with pytest.raises(em.ShapeError, match=r"cross_entropy: input \[2, 4, 3\] and target "
                                            r"\[2, 4\] disagree"):
        check(F.cross_entropy, TF.cross_entropy, x, y, backend="interpreter")
