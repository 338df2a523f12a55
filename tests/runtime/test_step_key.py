"""A training step reuses its compiled graph through a cheap check of the last call's key
(runtime/compiled.py `_LastKey`): whatever the key holds still recompiles, with the notice,
and whatever it leaves out (the lr) is fed anew, whichever way it changes between calls."""

import numpy as np
import pytest
from step_changes import train_with_change

from ember import nn, optim
from ember.runtime.data import digits


class Net(nn.Module):
    def __init__(self, p: float = 0.0):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        return self.fc2(self.drop(nn.functional.relu(self.fc1(x))))


@pytest.fixture(scope="module")
def data():
    d = digits(seed=0)
    return [(d.x_train[i * 32:(i + 1) * 32].astype(np.float32), d.y_train[i * 32:(i + 1) * 32])
            for i in range(4)]


def run(data, change=None, rebuild=False, p=0.0):
    """Two SGD steps, `change(model, step)`, two more (with `rebuild`: the reference)."""
    return train_with_change(lambda: Net(p), optim.SGD(lr=0.1), data, change, rebuild)


def same(a, b) -> bool:
    return a[0] == b[0] and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])


def set_momentum(model, step):
    step.optimizer.momentum = 0.9


def freeze_fc1(model, step):
    model.fc1.weight.requires_grad = False


def new_optimizer(model, step):
    step.optimizer = optim.SGD(lr=0.1, momentum=0.5, nesterov=True)


@pytest.mark.parametrize("change", [set_momentum, freeze_fc1, new_optimizer])
def test_a_setting_changed_in_place_recompiles_and_trains_as_a_fresh_compile(data, change,
                                                                              capsys):
    plain = run(data)
    capsys.readouterr()
    changed = run(data, change)
    assert "ember: recompiling train_step" in capsys.readouterr().err
    assert same(changed, run(data, change, rebuild=True)) and not same(changed, plain)
    assert len(changed[2]._cache) == 2


def test_a_frozen_weight_stays_put_after_the_recompile(data):
    _, before, _ = run(data[:2])
    _, after, _ = run(data, freeze_fc1)
    # the first two steps moved it; the last two (frozen) did not: equal to two steps alone
    np.testing.assert_array_equal(before["fc1.weight"], after["fc1.weight"])
    assert not np.array_equal(before["fc2.weight"], after["fc2.weight"])


def test_the_lr_is_fed_anew_without_recompiling(data, capsys):
    def tiny_lr(model, step):
        step.optimizer.lr = 1e-12

    _, before, _ = run(data[:2])
    capsys.readouterr()
    _, after, step = run(data, tiny_lr)
    assert "recompiling" not in capsys.readouterr().err and len(step._cache) == 1
    for k in before:
        np.testing.assert_allclose(after[k], before[k], atol=1e-9)


def test_flags_and_label_dtype_switch_between_cached_graphs(data, capsys):
    _, _, step = run(data, p=0.5)
    model = step.model
    x, y = data[0]
    capsys.readouterr()
    model.valid()
    valid = [step(x, y) for _ in range(2)]  # dropout off: the same loss... until updated
    model.train()
    step(x, y)
    step(x, y.astype(np.int32))
    err = capsys.readouterr().err
    assert err.count("ember: recompiling") == 2 and len(step._cache) == 3
    assert "(model flags, requires_grad or optimizer settings changed)" in err
    assert "(inputs [32, 64] f32, [32] i32; was [32, 64] f32, [32] i64)" in err
    assert valid[0] != valid[1]  # the valid graph still trains (flags only turn dropout off)
    model.valid()
    step(x, y)
    assert "recompiling" not in capsys.readouterr().err  # back to a cached graph


def test_a_param_buffer_reshaped_in_place_is_still_checked(data):
    _, _, step = run(data)
    value = step.model.fc1.bias.val()  # a result of the last step, pooled for recycling
    value.shape = (2, 16)
    with pytest.raises(ValueError, match="fc1.bias"):
        step(*data[0])
