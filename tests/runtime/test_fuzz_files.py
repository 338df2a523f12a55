"""Fuzzing the files ember reads: records (em.save / em.load) and training checkpoints.

Real files (an MLP, a model with BatchNorm buffers, a checkpoint after a few Adam steps)
get seeded damage: byte flips in header and body, cuts, garbage at the end, lying header
lengths, JSON defects in the header and in the metadata documents (wrong types, missing,
extra and duplicate keys, deep nesting, huge numbers, unicode), and tensors re-declared
with other dtypes and shapes. Loading one may only raise RecordError / CheckpointError,
and a failed load leaves params, ids, flags, optimizer state and counters bit-identical.
"""

import json
import random
from functools import partial

import numpy as np
import pytest
from file_damage import (
    mutate_bytes,
    mutate_document,
    mutate_header,
    mutate_metadata,
    mutate_tensors,
    retype,
)

import ember as em
from ember import nn, optim
from ember.frontend.records import RecordError, load, save
from ember.runtime.checkpoint import KEY, CheckpointError

ROUNDS = 250  # damaged files per kind of damage (on average: kinds are drawn at random)


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


class NormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(self.drop(nn.functional.relu(self.norm(self.fc1(x)))))


def model_state(model) -> list:
    return [(path, str(p.id), p.kind, p.val().dtype.str, p.val().tobytes(), p.requires_grad,
             p.frozen) for path, p in model.all_params()]


def step_state(step) -> list:
    opt = step.optimizer
    slots = sorted((str(pid), s, np.asarray(v).dtype.str, np.asarray(v).tobytes())
                   for pid, state in opt.state.items() for s, v in state.items())
    return [model_state(step.model), slots, opt.step_count, step.rng_step,
            json.dumps(opt.config())]


def batches(n: int):
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 3, 16))
            for _ in range(n)]


def make_step():
    em.seed(0)
    model = NormNet()
    opt = optim.Adam(lr=optim.LinearWarmup(optim.Cosine(1e-2, total_steps=20), warmup_steps=2),
                     clip_norm=1.0)
    return em.compile_train_step(model, nn.functional.cross_entropy, opt, backend="interpreter")


RECORD_DAMAGE = {"bytes": mutate_bytes, "header": mutate_header, "retype": retype,
                 "ids": partial(mutate_metadata, key="ember.param_ids")}
CHECKPOINT_DAMAGE = {"bytes": mutate_bytes, "header": mutate_header, "retype": retype,
                     "document": partial(mutate_metadata, key=KEY),  # checksum left stale
                     "sealed": mutate_document, "tensors": mutate_tensors}  # re-sealed


@pytest.mark.parametrize("cls", [Mlp, NormNet])
def test_damaged_records_raise_record_error_and_change_nothing(tmp_path, cls):
    em.seed(0)
    source = cls()
    if cls is NormNet:
        source.norm.running_var.set_value(np.linspace(0.5, 2, 8, dtype=np.float32))
    good = tmp_path / "good.safetensors"
    save(source, good)
    data = good.read_bytes()

    def fresh():
        em.seed(1)
        return cls()

    model = fresh()
    before = model_state(model)
    rng, path, outcomes = random.Random(11), tmp_path / "bad.safetensors", set()
    for _ in range(4 * ROUNDS):
        path.write_bytes(RECORD_DAMAGE[rng.choice(sorted(RECORD_DAMAGE))](data, rng))
        try:
            load(model, path)
        except RecordError as e:
            assert "\n" not in str(e)
            assert model_state(model) == before
            outcomes.add("error")
            continue
        outcomes.add("loaded")  # records carry no checksum: damaged values are still values
        model = fresh()
    assert "error" in outcomes
    load(model, good)  # records hold params and buffers (with ids), not flags
    assert [s for s in model_state(model) if s[2] != "flag"] == [
        s for s in model_state(source) if s[2] != "flag"]


def test_damaged_checkpoints_raise_checkpoint_error_change_nothing_and_resume_exactly(tmp_path):
    xs = batches(6)
    step = make_step()
    for x, y in xs[:3]:
        step(x, y)
    path = str(tmp_path / "good.ckpt")
    step.save_checkpoint(path, extra={"batch": 3})
    for x, y in xs[3:]:
        step(x, y)
    want = step_state(step)

    ref = make_step()
    ref.load_checkpoint(path)
    reference = step_state(ref)
    fresh = make_step()
    before = step_state(fresh)
    with open(path, "rb") as f:
        data = f.read()
    rng, bad, outcomes = random.Random(5), str(tmp_path / "bad.ckpt"), {}
    for i in range(6 * ROUNDS):
        kind = rng.choice(sorted(CHECKPOINT_DAMAGE))
        with open(bad, "wb") as f:
            f.write(CHECKPOINT_DAMAGE[kind](data, rng))
        if i == ROUNDS:  # the rest into a step that holds the checkpoint, not a fresh one
            fresh.load_checkpoint(path)
            before = reference
        try:
            fresh.load_checkpoint(bad)
        except CheckpointError as e:
            assert "\n" not in str(e), kind
            assert step_state(fresh) == before, kind
            outcomes[kind] = outcomes.get(kind, 0) + 1
            continue
        # damage that is not re-sealed loads only when it changed nothing the checksum
        # covers (a header's padding); a sealed edit may be a valid checkpoint of other state
        assert kind in ("sealed", "tensors") or step_state(fresh) == reference, kind
        fresh.load_checkpoint(path)
        before = reference
    assert set(outcomes) == set(CHECKPOINT_DAMAGE)

    assert fresh.load_checkpoint(path) == {"batch": 3}
    for x, y in xs[3:]:
        fresh(x, y)
    assert step_state(fresh) == want
