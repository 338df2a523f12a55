"""Params and optimizer state stay on a device backend between steps.

A fake device backend wraps the interpreter: its results are `Dev` arrays (like cupy's,
they are not numpy arrays and come back with `.get()`), and it counts the host arrays it
has to upload. After the first step no param or state array is uploaded again, while
`Param.val()` still sees every update (ids unchanged) and checkpoints still work.
"""

import types

import numpy as np
import pytest

import ember as em
import ember.runtime.compiled as compiled
import ember.runtime.steps as steps
from ember import nn, optim
from ember.backends import interpreter
from ember.runtime.data import digits
from ember.runtime.models import Mlp


class Dev:
    def __init__(self, a):
        self.a = np.asarray(a)
        self.shape, self.dtype, self.ndim = self.a.shape, self.a.dtype, self.a.ndim

    def get(self):
        return self.a.copy()

    def __float__(self):
        return float(self.a)


def fake_backend(uploads: list):
    def compile(graph):  # noqa: A001
        exe = interpreter.compile(graph)
        names = {op.attributes["id"]: op.attributes["path"] for op in graph.params()}

        def run(inputs, params):
            host = {}
            for pid, v in params.items():
                if isinstance(v, Dev):
                    host[pid] = v.a
                else:
                    uploads.append(names.get(pid, pid))
                    host[pid] = v
            state_args = len(graph.attributes.get("ember.state", ()))
            for i, x in enumerate(inputs[len(inputs) - state_args:]):
                if not isinstance(x, Dev):
                    uploads.append(f"state {i}")
            inputs = [x.a if isinstance(x, Dev) else x for x in inputs]
            return [Dev(o) for o in exe(inputs, host)]

        return run

    return types.SimpleNamespace(compile=compile)


@pytest.fixture
def device(monkeypatch):
    uploads = []
    monkeypatch.setattr(compiled, "DEVICE_BACKENDS", ("fake",))
    monkeypatch.setattr(compiled, "get_backend",
                        lambda name: fake_backend(uploads) if name == "fake" else
                        interpreter)
    return uploads


def test_params_and_state_stay_on_the_device_and_val_sees_updates(device, tmp_path):
    data = digits(seed=0)
    runs = {}
    for backend in ("interpreter", "fake"):
        em.seed(0)
        model = Mlp()
        ids = [p.id for p in model.parameters()]
        step = steps.TrainStep(model, nn.functional.cross_entropy, optim.Adam(lr=1e-2),
                                  backend=backend)
        for i in range(4):
            loss = step(data.x_train[i * 32:(i + 1) * 32], data.y_train[i * 32:(i + 1) * 32])
            assert isinstance(loss, float)
            if backend == "fake" and i == 0:
                assert len(device) == 4 + 8  # 4 params, 2 Adam moments each: once
                device.clear()
        assert [p.id for p in model.parameters()] == ids
        runs[backend] = {k: p.val() for k, p in model.named_parameters()}
    assert device == []  # nothing uploaded after the first step
    for k, v in runs["interpreter"].items():
        assert isinstance(runs["fake"][k], np.ndarray)
        np.testing.assert_array_equal(v, runs["fake"][k])
    assert all(isinstance(v, Dev) for s in step.optimizer.state.values() for v in s.values())

    step.save_checkpoint(str(tmp_path / "dev.ckpt"))
    model.head.weight.set_value(np.zeros(model.head.weight.shape, np.float32))
    step(data.x_train[:32], data.y_train[:32])  # a param set on the host is uploaded
    assert device == ["head.weight"]
