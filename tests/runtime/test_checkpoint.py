"""Checkpoints: resume is bit-exact, writes are atomic, damage and mismatches are caught."""

import io
import os
import signal

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.checkpoint import CheckpointError, read
from ember.runtime.compiled import TrainStep
from ember.runtime.data import digits
from ember.runtime.train import fit


class Net(nn.Module):
    def __init__(self, hidden=32, p=0.0):
        super().__init__()
        self.fc1 = nn.Linear(64, hidden)
        self.drop = nn.Dropout(p) if p else None
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = nn.functional.relu(self.fc1(x))
        return self.fc2(self.drop(x) if self.drop is not None else x)


@pytest.fixture(scope="module")
def data():
    d = digits(seed=0)
    d.x_train, d.y_train = d.x_train[:320], d.y_train[:320]  # 10 steps per epoch
    return d


def make(backend="cpu", p=0.0, cls=TrainStep):
    em.seed(0)
    model = Net(p=p)
    opt = optim.Adam(lr=optim.LinearWarmup(optim.Cosine(1e-2, total_steps=20), warmup_steps=4),
                     clip_norm=1.0)
    return model, cls(model, nn.functional.cross_entropy, opt, backend=backend)


def state(model, step):
    out = {f"param/{k}": p.val().copy() for k, p in model.all_params()}
    for pid, slots in step.optimizer.state.items():
        out.update({f"opt/{pid}/{s}": v.copy() for s, v in slots.items()})
    out["counters"] = np.array([step.optimizer.step_count, step.rng_step])
    return out


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def run_fit(step, data, epochs, **kw):
    return fit(step.model, data, step.optimizer, epochs=epochs, batch_size=32, progress=False,
               out=io.StringIO(), step=step, **kw)


@pytest.mark.parametrize("backend,p", [("cpu", 0.0), ("interpreter", 0.5)])
def test_two_epochs_equal_one_save_resume_one(tmp_path, data, backend, p):
    model, step = make(backend, p)
    run_fit(step, data, 2)
    want = state(model, step)

    _, step = make(backend, p)
    run_fit(step, data, 1, save=str(tmp_path / "run.ckpt"))
    model, step = make(backend, p)  # a fresh process, as it were
    history = run_fit(step, data, 2, resume=str(tmp_path / "run.ckpt"))
    assert [r.epoch for r in history] == [1, 2]
    assert_same(want, state(model, step))


class Interrupting(TrainStep):
    """Presses Ctrl-C during its 13th call."""

    def __call__(self, *inputs):
        out = super().__call__(*inputs)
        if self.optimizer.step_count == 13:
            signal.raise_signal(signal.SIGINT)
        return out


def test_ctrl_c_stops_after_the_step_saves_and_resumes_exactly(tmp_path, data):
    model, step = make()
    run_fit(step, data, 2)
    want = state(model, step)

    path = str(tmp_path / "run.ckpt")
    _, step = make(cls=Interrupting)
    history = run_fit(step, data, 2, save=path)
    assert len(history) == 1 and step.optimizer.step_count == 13
    assert read(path)[1]["extra"]["batch"] == 3
    model, step = make()
    run_fit(step, data, 2, resume=path)
    assert_same(want, state(model, step))


def test_truncated_checkpoint_is_detected_and_the_previous_one_still_loads(tmp_path, data,
                                                                           monkeypatch):
    path = tmp_path / "run.ckpt"
    model, step = make()
    run_fit(step, data, 1, save=str(path))
    good = path.read_bytes()
    saved = state(model, step)

    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(good[:len(good) // 2])
    with pytest.raises(CheckpointError, match="truncated or damaged"):
        step.load_checkpoint(str(cut))
    flipped = bytearray(good)
    flipped[-3] ^= 0xFF
    cut.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="checksum"):
        step.load_checkpoint(str(cut))
    assert_same(saved, state(model, step))  # nothing changed

    run_fit(step, data, 2)  # train on, then crash halfway through writing the next one
    class HalfWriter(io.FileIO):
        def write(self, b):
            super().write(b[:len(b) // 2])
            raise OSError("disk full")

    # the atomic writer (ember.files.write_atomically) opens its temp file by fd
    monkeypatch.setattr(os, "fdopen", lambda fd, mode: HalfWriter(fd, "w"))
    with pytest.raises(OSError, match="disk full"):
        step.save_checkpoint(str(path))
    monkeypatch.undo()
    assert path.read_bytes() == good
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []  # no temp left over
    model2, step2 = make()
    step2.load_checkpoint(str(path))
    assert_same(saved, state(model2, step2))


def test_checkpoint_from_another_model_lists_the_mismatched_paths(tmp_path, data):
    path = str(tmp_path / "run.ckpt")
    _, step = make()
    run_fit(step, data, 1, save=path)
    em.seed(1)
    other = Net(hidden=16, p=0.1)
    before = {k: p.val().copy() for k, p in other.all_params()}
    ostep = em.compile_train_step(other, nn.functional.cross_entropy, optim.Adam())
    with pytest.raises(CheckpointError) as e:
        ostep.load_checkpoint(path)
    msg = str(e.value)
    assert "fc1.weight (checkpoint [64, 32], model [64, 16])" in msg
    assert "fc2.weight" in msg and "drop.training" in msg
    for k, p in other.all_params():
        np.testing.assert_array_equal(before[k], p.val())


def test_flags_frozen_state_and_counters_are_restored(tmp_path, data):
    path = str(tmp_path / "run.ckpt")
    model, step = make("interpreter", p=0.5)
    model.fc1.freeze()
    run_fit(step, data, 1, save=path)
    assert model.drop.training.val()
    model2, step2 = make("interpreter", p=0.5)
    model2.valid()  # a resumed run must not silently train with dropout off
    step2.load_checkpoint(path)
    assert bool(model2.drop.training) and model2.fc1.weight.frozen
    assert not model2.fc1.weight.requires_grad and model2.fc2.weight.requires_grad
    assert step2.optimizer.step_count == step.optimizer.step_count == 10
    assert step2.rng_step == step.rng_step == 10
    assert step2.optimizer.schedule == step.optimizer.schedule


def test_checkpoint_of_another_optimizer_is_refused(tmp_path, data):
    path = str(tmp_path / "run.ckpt")
    _, step = make()
    run_fit(step, data, 1, save=path)
    em.seed(0)
    model = Net()
    sgd = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1))
    with pytest.raises(CheckpointError, match="trained with adam, not sgd"):
        sgd.load_checkpoint(path)
