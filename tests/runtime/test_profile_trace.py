"""`step.profile(*inputs, path=...)`: seconds per kernel of a compiled step, and a Chrome
trace JSON with one complete event per kernel; the step's state is left untouched."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.models import Mlp


def batch(rows: int = 8):
    rng = np.random.default_rng(0)
    return rng.standard_normal((rows, 64), dtype=np.float32), rng.integers(0, 10, rows)


def test_the_trace_has_one_event_per_kernel_and_nothing_is_updated(tmp_path):
    em.seed(0)
    model = Mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.Adam(lr=1e-3))
    x, y = batch()
    step(x, y)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    count, rng = step.optimizer.step_count, step.rng_step
    path = tmp_path / "trace.json"
    kernels = step.profile(x, y, path=str(path), repeat=3)
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    kernel_ops = [op for op in step.graph.ops if op.dialect == "kernel"]
    assert len(events) == len(kernels) == len(kernel_ops) > 3
    assert [e["name"] for e in events] == [name for name, _ in kernels]
    assert all(e["dur"] >= 0 and e["pid"] == e["tid"] == 0 for e in events)
    ends = [e["ts"] + e["dur"] for e in events]
    assert [e["ts"] for e in events[1:]] == pytest.approx(ends[:-1])  # end to end, in order
    assert step.optimizer.step_count == count and step.rng_step == rng
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_a_forward_profiles_too_and_the_interpreter_says_it_cannot():
    x, _ = batch()
    forward = em.compile(Mlp(), x)
    assert len(forward.profile(x, repeat=2)) >= 2
    on_interpreter = em.compile(Mlp(), x, backend="interpreter")
    with pytest.raises(NotImplementedError, match="interpreter backend does not time"):
        on_interpreter.profile(x)
