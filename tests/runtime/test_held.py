"""`memory_report()`'s held rows (runtime/held.py): what a step's Python side holds,
measured from the arrays, next to the plan's figures (issue 36)."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.held import distinct_bytes


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                         nn.Linear(256, 10))


def data(n: int = 128):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, 64)).astype(np.float32), rng.integers(0, 10, n)


def param_bytes(model: nn.Module) -> int:
    return sum(p.val().nbytes for p in model.parameters())


def test_views_of_one_buffer_count_it_once():
    a, b = np.zeros(1000, np.float32), np.zeros(10, np.float64)
    assert distinct_bytes([a, a[10:], a[::2].reshape(10, 50), b, b]) == 4000 + 80


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_a_trained_mlp_holds_its_plan(backend):
    """Params and AdamW's two slots once each; on cpu everything held within 1.1x of them
    and the executable's arena (the buffers it returns are the params and slots)."""
    em.seed(0)
    model = mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.AdamW(lr=1e-3),
                                 backend=backend)
    x, y = data()
    for _ in range(3):
        step(x, y)
    r, n, pad = step.memory_report(), param_bytes(model), 64 * 6  # a 64-byte aligned buffer each
    assert r["params"] == n <= r["held_params"] <= n + pad
    assert r["optimizer_state"] == 2 * n <= r["held_optimizer_state"] <= 2 * (n + pad)
    assert r["held_gradients"] == 0
    assert r["held_bytes"] == sum(r[k] for k in ("held_params", "held_optimizer_state",
                                                 "held_gradients", "held_executables"))
    if backend == "cpu":  # nothing but the params, the state and the executable's arena
        own = r["params"] + r["optimizer_state"] + r["real_arena"]
        assert own <= r["held_bytes"] <= min(1.1 * own, r["peak_bytes"]), r


def test_an_initial_value_a_clone_shares_is_held_too():
    em.seed(0)
    model = mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1))
    twin = model.clone()  # noqa: F841  (shares, so keeps alive, the initial values)
    step(*data())
    n = param_bytes(model)
    assert 2 * n <= step.memory_report()["held_params"] <= 2 * n + 64 * 6


def test_accumulation_buffers_and_data_parallel_buffers_are_held_gradients():
    em.seed(0)
    model = mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 accumulate=2)
    x, y = data()
    step(x, y)  # one micro-batch pending: its gradients in the buffers
    n = param_bytes(model)
    assert n <= step.memory_report()["held_gradients"] <= n + 64 * 6
    sharded = em.compile_train_step(mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                    data_parallel=em.distributed.Communicator(),
                                    shard_optimizer=True)
    sharded(x, y)
    r = sharded.memory_report()
    # the flat gradient buffer and the param arena: each param once, 64-byte aligned
    assert param_bytes(model) <= r["held_gradients"] <= param_bytes(model) + 64 * 7
    assert param_bytes(model) <= r["held_params"] <= param_bytes(model) + 64 * 6
