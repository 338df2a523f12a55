"""Checkpoints: resume is bit-exact, writes are atomic, damage and mismatches are caught."""

import io
import json
import os
import signal

import numpy as np
import pytest
from file_damage import metadata, reseal
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

import ember as em
from ember import nn, optim
from ember.runtime.checkpoint import KEY, CheckpointError, read
from ember.runtime.data import digits
from ember.runtime.steps import TrainStep
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


def _tempered():
    """`make()`'s run with a learnable temperature dividing the logits."""
    model, step = make()
    model.temperature = em.Param.from_array(np.array(1.5, np.float32))
    step.loss_fn = lambda out, y: nn.functional.cross_entropy(out / model.temperature, y)
    return model, step


def test_a_0d_param_and_its_slots_resume_exactly(tmp_path, data):
    """A learnable temperature and its Adam moments are 0-d in the file as in the run."""
    path = str(tmp_path / "run.ckpt")
    runs = [_tempered(), _tempered()]
    (a, step_a), (b, step_b) = runs
    run_fit(step_a, data, 1, save=path)
    step_b.load_checkpoint(path)
    assert_same(state(a, step_a), state(b, step_b))
    assert b.temperature.val().shape == () and b.temperature.val() != 1.5
    x, y = data.x_train[:32], data.y_train[:32]
    assert step_a(x, y) == step_b(x, y)
    assert_same(state(a, step_a), state(b, step_b))


def test_checkpoint_of_another_optimizer_is_refused(tmp_path, data):
    path = str(tmp_path / "run.ckpt")
    _, step = make()
    run_fit(step, data, 1, save=path)
    em.seed(0)
    model = Net()
    sgd = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1))
    with pytest.raises(CheckpointError, match="trained with adam, not sgd"):
        sgd.load_checkpoint(path)


@pytest.mark.parametrize("extra", [{"epoch": "1"}, {"history": [{"loss": 1.0}]},
                                   {"epoch": -1}, {"history": {}}])
def test_extra_data_the_run_cannot_read_is_refused_before_anything_changes(tmp_path, data,
                                                                          extra):
    from ember.runtime.train import FitState

    path = str(tmp_path / "run.ckpt")
    model, step = make("interpreter")
    run_fit(step, data, 1)
    step.save_checkpoint(path, extra)
    model2, step2 = make("interpreter")
    before = state(model2, step2)
    with pytest.raises(CheckpointError, match="extra data"):
        step2.load_checkpoint(path, FitState.from_extra)
    assert_same(state(model2, step2), before)


@pytest.fixture(scope="module")
def saved(tmp_path_factory, data):
    """A checkpoint after an epoch of Adam (interpreter backend, dropout and a frozen layer)."""
    path = str(tmp_path_factory.mktemp("ckpt") / "run.ckpt")
    model, step = make("interpreter", p=0.5)
    model.fc1.freeze()
    run_fit(step, data, 1, save=path)
    with open(path, "rb") as f:
        return f.read()


def _doc_edit(edit):
    """A re-sealed checkpoint whose document `edit` changed: it passes the checksum."""
    def damage(data):
        meta = metadata(data)
        doc = json.loads(meta[KEY])
        edit(doc)
        meta[KEY] = json.dumps(doc)
        return reseal(data, meta)
    return damage


def _tensor_edit(edit):
    def damage(data):
        tensors = st_load(data)
        edit(tensors)
        return reseal(data, tensors=tensors)
    return damage


def _format_1(data):
    """What an older ember wrote: the format and a tensor-only checksum inside the document."""
    meta = metadata(data)
    doc = json.loads(meta.pop(KEY))
    doc.update(format=1, sha256="0" * 64)
    return st_save(st_load(data), metadata={KEY: json.dumps(doc)})


def _set(*keys, value):
    def edit(doc):
        for k in keys[:-1]:
            doc = doc[k]
        doc[keys[-1]] = value
    return edit


def _drop(*keys):
    def edit(doc):
        for k in keys[:-1]:
            doc = doc[k]
        del doc[keys[-1]]
    return edit


DAMAGE = {
    "unsealed metadata edit": (lambda d: d.replace(b'rng_step\\": 10', b'rng_step\\": 11'),
                               "does not match the checksum"),
    "format 1": (_format_1, "no ember.format: an older ember wrote it"),
    "format 3": (lambda d: reseal(d, {**metadata(d), "ember.format": "3"}),
                 "has format 3; this ember reads format 2 only"),
    "no document": (lambda d: reseal(d, {"ember.format": "2"}), "has no 'ember' document"),
    # the three defects that used to overwrite params before their error
    "flag without value": (_doc_edit(_drop("flags", "drop.training", "value")),
                           r"flags\[drop.training\] lacks value"),
    "param without requires_grad": (_doc_edit(_drop("params", "fc2.bias", "requires_grad")),
                                    r"params\[fc2.bias\] lacks requires_grad"),
    "step count of another type": (_doc_edit(_set("optimizer_step", value="10")),
                                   "optimizer_step is a JSON string, not a JSON number"),
    "rng step null": (_doc_edit(_set("rng_step", value=None)), "rng_step is a JSON null"),
    "negative step": (_doc_edit(_set("optimizer_step", value=-1)), r"not in \[0, 2\*\*63\)"),
    "rng step past int64": (_doc_edit(_set("rng_step", value=2 ** 63)), r"not in \[0, 2\*\*63\)"),
    "boolean step": (_doc_edit(_set("rng_step", value=True)), "a JSON boolean"),
    "empty document": (_doc_edit(lambda doc: doc.clear()), "the document lacks model, params"),
    "document is a list": (lambda d: reseal(d, {**metadata(d), KEY: "[1]"}),
                           "its document is a JSON array, not a JSON object"),
    "extra key": (_doc_edit(_set("params", "fc1.weight", "zz", value=1)), "unexpected keys zz"),
    "bad ParamId": (_doc_edit(_set("params", "fc1.weight", "id", value="x" * 13)),
                    "not a ParamId"),
    "negative size": (_doc_edit(_set("params", "fc1.weight", "shape", value=[64, -32])),
                      "not an array of sizes"),
    "kind of another param": (_doc_edit(_set("params", "fc1.bias", "kind", value="buffer")),
                              r"kind or dtype mismatch: fc1.bias \(checkpoint buffer f32"),
    "buffer that requires grad": (_doc_edit(_set("params", "fc2.bias", "kind", value="buffer")),
                                  "is a buffer param that requires gradients"),
    "unknown dtype": (_doc_edit(_set("params", "fc1.bias", "dtype", value="f128")),
                      "dtype is f128, not one of"),
    "unknown slot": (_doc_edit(_set("optimizer_state", "fc2.bias", value=["exp_avg", "zz"])),
                     "optimizer state zz of fc2.bias: adam keeps exp_avg, exp_avg_sq"),
    "slot without its tensor": (_tensor_edit(lambda t: t.pop("optim/fc2.bias/exp_avg")),
                                "tensors missing: optim/fc2.bias/exp_avg"),
    "state of a flag": (_doc_edit(_set("optimizer_state", "drop.training", value=[])),
                        "optimizer state for drop.training, which is not a param"),
    "slot named twice": (_doc_edit(_set("optimizer_state", "fc2.bias",
                                        value=["exp_avg", "exp_avg"])), "names a slot twice"),
    "NaN hyper-parameter": (_doc_edit(_set("optimizer", "options", "eps", value=float("nan"))),
                            "bad optimizer config: ValueError: Out of range float"),
    "int hyper-parameter": (_doc_edit(_set("optimizer", "options", "eps", value=1)),
                            "not one this ember writes"),
    "unknown option": (_doc_edit(_set("optimizer", "options", "zz", value=1.0)),
                       "unexpected keyword argument 'zz'"),
    "deep schedule": (_doc_edit(_set("optimizer", "schedule", value=json.loads(
        "{" + '"after": {' * 400 + '"kind": "Constant", "lr": 1' + "}" * 401))),
        "bad optimizer config"),
    "negative lr": (_doc_edit(_set("optimizer", "schedule", "after", "lr", value=-1.0)),
                    "lr must be positive"),
    "extra not an object": (_doc_edit(_set("extra", value=[1])), "extra is a JSON array"),
    "tensor missing": (_tensor_edit(lambda t: t.pop("param/fc2.bias")),
                       "tensors missing: param/fc2.bias"),
    "tensor unexpected": (_tensor_edit(lambda t: t.update({"param/zz": np.zeros(2)})),
                          "unexpected tensors: param/zz"),
    "tensor of another dtype": (
        _tensor_edit(lambda t: t.update({"optim/fc2.bias/exp_avg": np.zeros(10)})),
        r"tensor optim/fc2.bias/exp_avg is \[10\] float64, the model's param is \[10\] float32"),
    "tensor of another shape": (
        _tensor_edit(lambda t: t.update({"param/fc2.bias": np.zeros(11, np.float32)})),
        r"tensor param/fc2.bias is \[11\] float32"),
}


@pytest.mark.parametrize("name", DAMAGE)
def test_every_defect_is_one_checkpoint_error_and_changes_nothing(tmp_path, saved, name):
    damage, match = DAMAGE[name]
    path = tmp_path / "bad.ckpt"
    path.write_bytes(damage(saved))
    model, step = make("interpreter", p=0.5)
    step.rng_step = 3
    before = state(model, step)
    modes = [(p.requires_grad, p.frozen) for _, p in model.all_params()]
    with pytest.raises(CheckpointError, match=match) as e:
        step.load_checkpoint(str(path))
    assert "\n" not in str(e.value)
    assert_same(before, state(model, step))
    assert modes == [(p.requires_grad, p.frozen) for _, p in model.all_params()]
    assert step.optimizer.config() == make("interpreter", p=0.5)[1].optimizer.config()
    path.write_bytes(saved)
    assert step.load_checkpoint(str(path))["batch"] == 0 and step.optimizer.step_count == 10
