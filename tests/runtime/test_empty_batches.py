"""Empty batches and empty axes, against PyTorch on every backend: the mean of nothing is
NaN and its gradient empty (never a ZeroDivisionError at compile time), softmax over an
empty axis is empty, and what torch refuses (the max of nothing, an empty pooling window)
is a ShapeError at trace time."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim

F = nn.functional
BACKENDS = ["interpreter", "cpu"]
torch = pytest.importorskip("torch")  # the tables below are torch's functions


def raw_grad(model, loss_fn, backend: str, *inputs) -> tuple[float, dict]:
    """(loss, {ParamId: grad}) as the compiled grad graph computes them: the runtime refuses
    a NaN loss (and keeps the params), so the graph is run without that guard."""
    grad = em.compile_grad(model, loss_fn, backend=backend)
    entry = grad.entry(inputs)
    table = grad.param_table()
    loss, *grads = grad.run(entry, grad.arguments(entry, inputs), grad.params(table))
    ids = entry.graph.attributes["ember.grads"]
    return float(loss), {table[pid].id: g for pid, g in zip(ids, grads)}


def torch_params(model) -> dict:
    return {name: torch.tensor(p.val(), requires_grad=True)
            for name, p in model.named_parameters()}


def assert_grads_match(model, grads: dict, params: dict) -> None:
    for name, p in model.named_parameters():
        want = params[name].grad
        want = np.zeros(p.shape, np.float32) if want is None else want.numpy()
        np.testing.assert_allclose(grads[p.id], want, rtol=1e-5, atol=1e-6, err_msg=name)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 6)
        self.fc2 = nn.Linear(6, 5)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def torch_mlp(p: dict, x):
    h = torch.relu(x @ p["fc1.weight"] + p["fc1.bias"])
    return h @ p["fc2.weight"] + p["fc2.bias"]


TF = torch.nn.functional
LOSSES = {  # name: (ember loss, torch loss), both of (logits, labels)
    "cross_entropy": (F.cross_entropy, TF.cross_entropy),
    "label_smoothing": (lambda o, y: F.cross_entropy(o, y, label_smoothing=0.1),
                        lambda o, y: TF.cross_entropy(o, y, label_smoothing=0.1)),
    "nll_loss": (lambda o, y: F.nll_loss(F.log_softmax(o, 1), y),
                 lambda o, y: TF.nll_loss(o.log_softmax(1), y)),
    "mse_loss": (lambda o, y: F.mse_loss(o, o * 0.0), lambda o, y: TF.mse_loss(o, o * 0.0)),
}
EMPTY_X, EMPTY_Y = np.zeros((0, 8), np.float32), np.zeros(0, np.int64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", LOSSES)
def test_an_empty_batch_gives_torchs_nan_loss_and_gradients(loss, backend):
    em.seed(0)
    model = Mlp()
    got_loss, grads = raw_grad(model, LOSSES[loss][0], backend, EMPTY_X, EMPTY_Y)
    params = torch_params(model)
    want = LOSSES[loss][1](torch_mlp(params, torch.tensor(EMPTY_X)), torch.tensor(EMPTY_Y))
    want.backward()
    assert np.isnan(got_loss) and np.isnan(want.item())
    assert_grads_match(model, grads, params)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["grad", "train_step"])
def test_an_empty_batch_is_refused_as_a_nan_loss_and_the_params_are_kept(kind, backend):
    em.seed(0)
    model = Mlp()
    before = {name: p.val().copy() for name, p in model.named_parameters()}
    step = (em.compile_grad(model, F.cross_entropy, backend=backend) if kind == "grad" else
            em.compile_train_step(model, F.cross_entropy, optim.SGD(lr=0.1), backend=backend))
    with pytest.raises(FloatingPointError, match="the loss is nan at step 0"):
        step(EMPTY_X, EMPTY_Y)
    for name, p in model.named_parameters():
        np.testing.assert_array_equal(p.val(), before[name])


class Shifted(nn.Module):
    """fn(x + w): a parameter of the input's shape, so that its gradient is fn's."""

    def __init__(self, fn, shape):
        super().__init__()
        self.fn = fn
        self.w = em.Param.from_array(np.random.default_rng(1).normal(size=shape)
                                     .astype(np.float32))

    def forward(self, x):
        return self.fn(x + self.w)


EMPTY_AXIS = {  # name: (ember fn, torch fn, input shape); the results are empty or NaN
    "softmax": (lambda x: F.softmax(x, 1), lambda x: x.softmax(1), (3, 0)),
    "log_softmax": (lambda x: F.log_softmax(x, 1), lambda x: x.log_softmax(1), (3, 0)),
    "mean_of_nothing": (lambda x: x.mean(), lambda x: x.mean(), (0,)),
    "mean_of_no_rows": (lambda x: x.mean(0), lambda x: x.mean(0), (0, 4)),
    "group_norm": (lambda x: F.group_norm(x, 2), lambda x: TF.group_norm(x, 2), (0, 4, 3)),
    "layer_norm": (lambda x: F.layer_norm(x, (4,)), lambda x: TF.layer_norm(x, (4,)), (0, 4)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", EMPTY_AXIS)
def test_empty_axes_give_torchs_values_and_gradients(case, backend):
    fn, tfn, shape = EMPTY_AXIS[case]
    x = np.zeros(shape, np.float32)
    em.seed(0)
    model = Shifted(fn, shape)
    params = torch_params(model)
    want = tfn(torch.tensor(x) + params["w"])
    got = em.compile(model, em.TensorSpec(shape, "f32"), backend=backend)(x)
    np.testing.assert_array_equal(got, want.detach().numpy())  # shapes, and NaN where torch's
    want.sum().backward()
    loss, grads = raw_grad(model, lambda out: out.sum(), backend, x)
    np.testing.assert_array_equal(loss, want.sum().item())
    assert_grads_match(model, grads, params)


def trace_error(fn, shape) -> str:
    with pytest.raises(em.ShapeError) as e:
        em.trace(Shifted(fn, shape), em.TensorSpec(shape, "f32"))
    return str(e.value)


def test_the_max_of_nothing_is_refused_at_trace_time():
    """torch and numpy refuse it; the backends would disagree (-inf or an error)."""
    assert "max: axis 1 of [3, 0] is empty" in trace_error(lambda x: x.max(1), (3, 0))
    assert "max: axis 0 of [0] is empty" in trace_error(lambda x: x.max(), (0,))
    em.trace(Shifted(lambda x: x.amax(1), (0, 3)), em.TensorSpec((0, 3), "f32"))  # no rows: ok


@pytest.mark.parametrize("shape", [(1, 2, 3, 0), (1, 2, 0, 4), (1, 0, 4, 4)])
def test_adaptive_pooling_of_an_empty_window_is_refused_at_trace_time(shape):
    """As torch: not a ZeroDivisionError while building the averaging matrices."""
    message = trace_error(lambda x: F.adaptive_avg_pool2d(x, 2), shape)
    assert f"adaptive_avg_pool2d: input {list(shape)} is empty in a non-batch dimension" in message
