"""A trained model holds each param and optimizer slot once: the first step's inputs (the
Params' initial values, the zero optimizer state) are written over by the first update
(cpu) or not kept alive after the runtime rebound them (issue 36), unless a clone still
shares a Param's initial value."""

from __future__ import annotations

import copy
import gc
import weakref

import numpy as np
import pytest

import ember as em
from ember import nn, optim


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))


def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((64, 16)).astype(np.float32), rng.integers(0, 4, 64)


@pytest.mark.parametrize("backend", ["cpu", "interpreter"])
def test_initial_values_and_zero_slots_go_once_rebound(backend):
    em.seed(0)
    model, opt = mlp(), optim.AdamW(lr=1e-2)
    step = em.compile_train_step(model, nn.functional.cross_entropy, opt, backend=backend)
    initial = [weakref.ref(p.val()) for p in model.parameters()]
    zeros = [weakref.ref(opt.slot(p.id, name, p)) for p in model.parameters()
             for name in ("exp_avg", "exp_avg_sq")]  # AdamW's, as a first step makes them
    x, y = data()
    for _ in range(4):
        step(x, y)
    gc.collect()
    # gone, or (cpu: the first update written over them) the very arrays held now
    current = {id(p.val()) for p in model.parameters()}
    current |= {id(a) for slots in opt.state.values() for a in slots.values()}
    assert not [r for r in initial + zeros if r() is not None and id(r()) not in current]
    assert all(p._state.value is None for p in model.parameters())
    assert sorted(next(iter(opt.state.values()))) == ["exp_avg", "exp_avg_sq"]  # (those)


def test_the_first_update_is_written_over_the_initial_values():
    """Where every later update is written over the last, so is the first over the initial
    values: the first step never holds both (a GPT-2-small body's peak: 310 MiB less)."""
    em.seed(0)
    model, opt = mlp(), optim.AdamW(lr=1e-2)
    step = em.compile_train_step(model, nn.functional.cross_entropy, opt)
    initial = [p.val() for p in model.parameters()]
    before = [a.copy() for a in initial]
    step(*data())
    first = [p.val() for p in model.parameters()]
    step(*data())
    in_place = [p.val() is a for p, a in zip(model.parameters(), first)]
    assert sum(in_place) >= 2  # both weights (a bias summed by its gradient's kernel is not)
    for a, b, c, same in zip(initial, before, first, in_place):
        assert (c is a) == same and not np.array_equal(c, b)


def test_a_clone_keeps_the_initial_value_it_shares():
    em.seed(0)
    model = mlp()
    twin = model.clone()
    first = [p.val().copy() for p in model.parameters()]
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.SGD(lr=0.1))
    x, y = data()
    step(x, y), step(x, y)
    for before, p, q in zip(first, model.parameters(), twin.parameters()):
        assert not np.array_equal(p.val(), before)  # trained
        np.testing.assert_array_equal(q.val(), before)  # the clone: as it was


def test_a_param_copy_read_later_sees_the_value_it_was_copied_with():
    p = nn.Linear(3, 2).weight
    v0 = p.val().copy()
    q = copy.copy(p)
    p.set_value(np.zeros(p.shape, np.float32))
    np.testing.assert_array_equal(q.val(), v0)
    r = nn.Linear(3, 2).weight
    r.val()
    r.set_value(np.ones(r.shape, np.float32))
    assert r._state.value is None and r.val().sum() == r.val().size


@pytest.mark.parametrize("opt", [optim.AdamW(lr=1e-2), optim.SGD(lr=0.1, momentum=0.9)])
def test_a_step_whose_loss_is_not_finite_changes_nothing_after_bound_steps(opt):
    """The bound call stops after the loss's kernel when the loss is not finite (the
    entry's loss check: kernels after it may update params in place), and the step
    raises with every param and optimizer slot as the last good step left it."""
    em.seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 4))
    step = em.compile_train_step(model, nn.functional.cross_entropy, opt)
    x, y = data()
    for _ in range(3):
        step(x, y)
    params = [p.val().copy() for p in model.parameters()]
    slots = {pid: {k: v.copy() for k, v in d.items()} for pid, d in opt.state.items()}
    count = opt.step_count
    with pytest.raises(FloatingPointError, match="not updated"):
        step(np.full_like(x, 3e38), y)  # finite input, an infinite loss
    assert opt.step_count == count
    for before, p in zip(params, model.parameters()):
        np.testing.assert_array_equal(p.val(), before)
    for pid, d in opt.state.items():
        for k, v in d.items():
            np.testing.assert_array_equal(v, slots[pid][k])
    assert np.isfinite(step(x, y))


def test_params_updated_in_place_match_the_interpreter_and_stay_current():
    """Where the schedule allows (backends/cpu/call/bound.py `overwrites`), a bound step
    writes a param's and its optimizer state's new values over the old ones: one copy of
    each, an array the user holds reads the current value, and the values are the
    interpreter's."""
    def train(backend):
        em.seed(1)
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(),
                              nn.Linear(32, 4))
        step = em.compile_train_step(model, nn.functional.cross_entropy,
                                     optim.AdamW(lr=1e-2), backend=backend)
        x, y = data()
        held = None
        for k in range(6):
            step(x, y)
            if k == 2:  # (weakly: a strong reference makes the next call a general one)
                held = [weakref.ref(p.val()) for p in model.parameters()]
        return model, step, held

    model, step, held = train("cpu")
    reference, _, _ = train("interpreter")
    for p, q in zip(model.parameters(), reference.parameters()):
        np.testing.assert_allclose(p.val(), q.val(), rtol=1e-5, atol=1e-6)
    donated = step._last.bound.run._donated
    assert donated  # some pairs are updated in place
    in_place = [r for r, p in zip(held, model.parameters()) if r() is p.val()]
    assert in_place  # the arrays of three steps ago are the params now, updated in place


@pytest.mark.parametrize("opt", [lambda: optim.Adam(lr=1e-2), lambda: optim.SGD(lr=0.1,
                                                                                momentum=0.9)])
def test_in_place_updates_are_bit_for_bit_the_out_of_place_ones(opt, monkeypatch):
    """20 steps with and without in-place updates give the same bits (a kernel reading a
    param after writing over it would not; tests/runtime/test_checkpoint.py's save/resume
    equality is the other guard: it caught fused bias updates with their reduction, whose
    results are stored in phases, when they were admitted)."""
    from ember.backends.cpu.call import bound

    def train():
        em.seed(2)
        model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 10))
        step = em.compile_train_step(model, nn.functional.cross_entropy, opt())
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32)
        for _ in range(20):
            step(x, y)
        return [p.val().copy() for p in model.parameters()], step

    in_place, step = train()
    assert step._last.bound.run._donated
    monkeypatch.setattr(bound, "overwrites", lambda *args: False)
    out_of_place, step = train()
    assert not step._last.bound.run._donated
    for a, b in zip(in_place, out_of_place):
        np.testing.assert_array_equal(a, b)
