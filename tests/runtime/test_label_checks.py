"""Class labels out of range are rejected by every loss that takes them, on every backend,
as plain cross_entropy's are; in-range labels give PyTorch's values. Out-of-range gather
(embedding) indices are an IndexError, wrapped in the ExecutionError naming the op."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends.input_checks import InputCheckError
from ember.runtime.debug import ExecutionError

F = nn.functional
C = 5
BACKENDS = ["interpreter", "cpu"]

LOSSES = {  # name: (ember loss of logits, torch's, given torch.nn.functional)
    "cross_entropy": (F.cross_entropy, lambda tf, o, y: tf.cross_entropy(o, y)),
    "label_smoothing": (lambda o, y: F.cross_entropy(o, y, label_smoothing=0.2),
                        lambda tf, o, y: tf.cross_entropy(o, y, label_smoothing=0.2)),
    "nll_loss": (lambda o, y: F.nll_loss(F.log_softmax(o, 1), y),
                 lambda tf, o, y: tf.nll_loss(o.log_softmax(1), y)),
}


class Logits(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, C, bias=False)

    def forward(self, x):
        return self.fc(x)


def batch(labels):
    x = np.random.default_rng(0).normal(size=(len(labels), 8)).astype(np.float32)
    return x, np.asarray(labels, np.int64)


def grad_fn(loss: str, backend: str):
    em.seed(0)
    model = Logits()
    return model, em.compile_grad(model, LOSSES[loss][0], backend=backend)


@pytest.mark.parametrize("bad", [C, -1])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", LOSSES)
def test_out_of_range_labels_raise(loss, backend, bad):
    model, grad = grad_fn(loss, backend)
    with pytest.raises(ValueError, match=rf"labels out of range: input 1 has values \[{bad}\] "
                                         rf"outside \[0, {C}\)"):
        grad(*batch([0, 1, bad, 2]))
    # every loss skips torch's default ignore_index -100: that value alone passes the check
    assert grad.graph.attributes["ember.label_args"] == [[1, C, -100]]


@pytest.mark.parametrize("loss", ["label_smoothing", "nll_loss"])
def test_the_cpu_backend_checks_one_hot_labels_natively(loss):
    """The check is compiled into the cpu entry: it fails before any kernel runs."""
    model, grad = grad_fn(loss, "cpu")
    x, y = batch([0, 1, 2, 3])
    grad(x, y)
    entry = grad._last
    assert entry.native_checks
    y[1] = C
    with pytest.raises(InputCheckError, match=rf"input 1 has labels outside \[0, {C}\)"):
        entry.run([x, y], grad.params(grad.param_table()))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", LOSSES)
def test_in_range_labels_give_torchs_loss_and_gradient(loss, backend):
    torch = pytest.importorskip("torch")
    model, grad = grad_fn(loss, backend)
    x, y = batch([0, 4, 2, 2, 1, 3])
    got = grad(x, y)
    w = torch.tensor(model.fc.weight.val(), requires_grad=True)
    want = LOSSES[loss][1](torch.nn.functional, torch.tensor(x) @ w, torch.tensor(y))
    want.backward()
    np.testing.assert_allclose(grad.loss, want.item(), rtol=1e-5)
    np.testing.assert_allclose(got[model.fc.weight], w.grad.numpy(), rtol=1e-5, atol=1e-7)


class Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(C, 3)

    def forward(self, idx):
        return self.emb(idx).sum(1)


@pytest.mark.parametrize("bad", [C, -1])
@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_embedding_indices_are_an_index_error(backend, bad):
    em.seed(0)
    f = em.compile(Embed(), em.TensorSpec((4,), "i64"), backend=backend)
    with pytest.raises(ExecutionError, match=rf"ember.gather.*IndexError: ember.gather: index "
                                             rf"{bad} out of range for a table of {C} rows") as e:
        f(np.array([0, 1, bad, 2]))
    assert isinstance(e.value.__cause__, IndexError)


class TokenLogits(nn.Module):
    """A language model's shape: [batch, T] token ids in, [batch, T, C] logits out."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(C, 3)
        self.out = nn.Linear(3, C)

    def forward(self, idx):
        return self.out(self.emb(idx))


REARRANGED = {  # targets [batch, T] reaching the loss rearranged, as a language model's do
    "reshape": lambda o, y: F.cross_entropy(o.reshape(-1, C), y.reshape(-1)),
    "transpose": lambda o, y: F.cross_entropy(o.transpose(1, 0, 2).reshape(-1, C),
                                              y.transpose(1, 0).reshape(-1)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", REARRANGED)
def test_labels_reshaped_on_the_way_to_the_loss_are_checked(how, backend):
    """An out-of-range target the loss reads through a reshape or transpose is rejected as
    one read as it is (it used to drop out of the loss silently)."""
    em.seed(0)
    step = em.compile_train_step(TokenLogits(), REARRANGED[how], optim.SGD(lr=0.1),
                                 backend=backend)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, C, (2, 4)), rng.integers(0, C, (2, 4))
    step(x, y)
    assert step._last.labels == ((1, C, -100),)
    y[1, 2] = C + 2
    with pytest.raises(ValueError, match=rf"labels out of range: input 1 has values "
                                         rf"\[{C + 2}\] outside \[0, {C}\)"):
        step(x, y)
