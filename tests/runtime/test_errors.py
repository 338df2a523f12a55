"""Bad input and failing steps: clear errors that name the op and source line; params intact."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.backends.interpreter import reference
from ember.runtime.data import digits
from ember.runtime.debug import AnomalyError, ExecutionError


class Net(nn.Module):
    def __init__(self, log_inputs=False):
        super().__init__()
        self.fc1 = nn.Linear(64, 16)
        self.fc2 = nn.Linear(16, 10)
        self.log_inputs = log_inputs

    def forward(self, x):
        if self.log_inputs:
            x = x.log()  # LOG LINE: log(0) = -inf on the digits' blank pixels
        h = nn.functional.relu(self.fc1(x))  # RELU LINE
        return self.fc2(h)


def line_of(marker):
    for i, text in enumerate(open(__file__).read().splitlines(), 1):
        if marker in text and "def line_of" not in text and "line_of(" not in text:
            return i
    raise AssertionError(marker)


@pytest.fixture(scope="module")
def data():
    return digits(seed=0)


def values(model):
    return {k: p.val().copy() for k, p in model.named_parameters()}


def make(log_inputs=False, backend="interpreter", **kw):
    em.seed(0)
    model = Net(log_inputs)
    return model, em.compile_train_step(model, nn.functional.cross_entropy,
                                        optim.Adam(lr=1e-2), backend=backend, **kw)


def test_an_error_inside_a_step_names_the_op_and_the_forward_line(data, monkeypatch):
    model, step = make()
    step(data.x_train[:8], data.y_train[:8])
    before = values(model)

    def broken(attrs, x):
        raise FloatingPointError("kernel exploded")

    monkeypatch.setitem(reference.KERNELS, "ember.relu", broken)
    with pytest.raises(ExecutionError) as e:
        step(data.x_train[:8], data.y_train[:8])
    msg = str(e.value)
    assert "'ember.relu'" in msg and "kernel exploded" in msg
    assert f"test_errors.py:{line_of('RELU LINE')}" in msg
    for k, v in values(model).items():
        np.testing.assert_array_equal(before[k], v)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_detect_anomaly_names_the_first_op_that_made_inf(data, backend):
    model, step = make(log_inputs=True, backend=backend, detect_anomaly=True)
    before = values(model)
    with pytest.raises(AnomalyError) as e:
        step(data.x_train[:8], data.y_train[:8])
    msg = str(e.value)
    assert "'ember.log'" in msg and f"test_errors.py:{line_of('LOG LINE')}" in msg
    assert "Inf" in msg and "not updated" in msg
    for k, v in values(model).items():
        np.testing.assert_array_equal(before[k], v)


def test_a_nan_loss_stops_before_the_update_and_points_to_detect_anomaly(data):
    model, step = make(log_inputs=True)
    before = values(model)
    with pytest.raises(FloatingPointError, match="detect_anomaly"):
        step(data.x_train[:8], data.y_train[:8])
    for k, v in values(model).items():
        np.testing.assert_array_equal(before[k], v)


@pytest.mark.parametrize("backend", ["interpreter", "cpu"])
def test_nan_inputs_out_of_range_labels_and_mismatched_batches_are_clear(data, backend):
    """On cpu the checks run natively, before the first kernel; the message is the same."""
    model, step = make(backend=backend)
    before = values(model)
    x, y = data.x_train[:8].copy(), data.y_train[:8].copy()
    x[3, 5] = np.nan
    with pytest.raises(ValueError, match=r"input 0 contains NaN or Inf \(rows \[3\]\)"):
        step(x, y)
    x[3, 5], x[6, 0] = 0, -np.inf
    with pytest.raises(ValueError, match=r"input 0 contains NaN or Inf \(rows \[6\]\)"):
        step(x, y)
    y[2] = 10
    with pytest.raises(ValueError, match=r"labels out of range: input 1 has values \[10\] "
                                         r"outside \[0, 10\)"):
        step(data.x_train[:8], y)
    with pytest.raises(ValueError, match=r"argument 1 \(loss argument 0\) has 6, but argument 0 "
                                         r"\(model input 0\) has 8"):
        step(data.x_train[:8], data.y_train[:6])
    grad = em.compile_grad(model, nn.functional.cross_entropy, backend=backend)
    with pytest.raises(ValueError, match=r"labels out of range: input 1 has values \[-1\]"):
        grad(data.x_train[:8], -np.ones(8, np.int64))
    assert step.optimizer.step_count == 0
    for k, v in values(model).items():
        np.testing.assert_array_equal(before[k], v)
    assert np.isfinite(step(data.x_train[:8], data.y_train[:8]))  # and it still runs


def test_a_fused_step_still_names_the_scalar_op(data, monkeypatch):
    """Replays use the graph from before `fuse`, so a fused kernel hides nothing."""
    import ember.runtime.steps as steps

    plain = steps.training_pipeline

    def fused(*args, **kwargs):
        stages = plain(*args, **kwargs)
        return stages if "fuse" in stages else [*stages, "fuse"]

    monkeypatch.setattr(steps, "training_pipeline", fused)
    model, step = make(log_inputs=True, backend="cpu", detect_anomaly=True)
    with pytest.raises(AnomalyError, match=r"'ember.log'.*test_errors.py:"
                                           + str(line_of("LOG LINE"))):
        step(data.x_train[:8], data.y_train[:8])
    assert step.stages[-1] == "fuse" and "kernel.fused" in step.ir()


def test_float64_inputs_to_a_float32_model_say_how_to_cast():
    import ember as em
    from ember import nn

    with pytest.raises(em.ShapeError, match=r"input 0 is float64 .*x\.astype\(np\.float32\)"):
        em.compile(nn.Linear(4, 3), np.zeros((2, 4)))
