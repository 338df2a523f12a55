"""The cheap per-step checks behind a compiled step's reuse of its graph (TreeWatch,
SettingsWatch, the last key's inputs): each still notices what it watches, whichever way it
changes, so the step trains as a freshly compiled one would."""

import pickle
from types import SimpleNamespace

import numpy as np
import pytest
from step_changes import train_with_change

import ember as em
from ember import nn, optim
from ember.frontend.module import TreeWatch
from ember.frontend.param import ParamId
from ember.runtime.update import SettingsWatch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(8, 8), nn.Linear(8, 8)]
        self.extra = [nn.Linear(8, 8)]
        self.table = {"a": nn.Linear(8, 8)}
        self.pair = ([nn.Linear(8, 8)], 3)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(x)


def _still_unchanged(edit) -> bool:
    em.seed(0)
    net = Net()
    spare = nn.Linear(8, 8)
    watch = TreeWatch(net)
    assert watch.unchanged()
    edit(net, spare)
    return watch.unchanged()


def _shift(net, spare):  # one list grows as another shrinks: the total length is the same
    net.extra.append(net.layers.pop())


def _rename(net, spare):  # the same value under another key
    net.table["b"] = net.table.pop("a")


def _reorder(net, spare):
    net.layers.reverse()


@pytest.mark.parametrize("edit", [
    _shift, _rename, _reorder,
    lambda n, s: n.pair[0].append(s),             # a list inside a tuple field
    lambda n, s: n.table.update(c=s),             # a dict grown
    lambda n, s: n.table.clear(),                 # a dict emptied
    lambda n, s: n.extra.clear(),                 # the last container emptied
    lambda n, s: n.extra.append(s),               # the last container grown
], ids=["shift", "rename", "reorder", "tuple-list", "dict-grow", "dict-clear", "list-clear",
        "list-grow"])
def test_tree_watch_sees_containers_change_in_place(edit):
    assert not _still_unchanged(edit)


def test_tree_watch_of_a_tree_without_containers_sees_a_field_assigned():
    em.seed(0)
    layer = nn.Linear(4, 4)
    watch = TreeWatch(layer)
    assert watch.unchanged()
    layer.bias = em.Param.from_array(np.zeros(4, np.float32))
    assert not watch.unchanged()


def test_settings_watch_sees_each_setting_and_the_optimizer_replaced():
    owner = SimpleNamespace(optimizer=optim.AdamW(lr=1e-3))
    watch = SettingsWatch(owner)
    owner.optimizer.step_count += 5  # what a step changes is not a setting
    owner.optimizer.state[ParamId(1)] = {}
    owner.optimizer.lr = 1e-4  # nor is the lr (fed anew): only its schedule object changed
    assert SettingsWatch(owner).unchanged()
    for attribute, value in [("beta1", 0.8), ("beta2", 0.99), ("weight_decay", 0.1),
                             ("eps", 1e-6), ("clip_norm", 1.0)]:
        watch = SettingsWatch(owner)
        setattr(owner.optimizer, attribute, value)
        assert not watch.unchanged(), attribute
    watch = SettingsWatch(owner)
    owner.optimizer.extra = 1  # a new attribute a subclass's options() might read
    assert not watch.unchanged()
    watch = SettingsWatch(owner)
    owner.optimizer = optim.SGD(lr=0.1)  # another kind, without AdamW's attributes
    assert not watch.unchanged()


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 10)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def batches():
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((8, 16)).astype(np.float32), rng.integers(0, 10, 8))
            for _ in range(4)]


def _adamw_run(batches, change=None, rebuild=False):
    """Two AdamW steps, `change(model, step)`, two more (with `rebuild`, on a new step)."""
    return train_with_change(Mlp, optim.AdamW(lr=1e-2), batches, change, rebuild)[:2]


def _betas(model, step):
    step.optimizer.beta1, step.optimizer.beta2 = 0.5, 0.9


def _weight_decay(model, step):
    step.optimizer.weight_decay = 0.5


def _freeze(model, step):
    model.fc1.freeze()


def _requires_grad(model, step):
    model.fc2.weight.requires_grad = False


def _replace_a_layer(model, step):
    model.fc2 = nn.Linear(32, 10)


def _adam(model, step):
    step.optimizer = optim.Adam(lr=1e-2)


@pytest.mark.parametrize("change", [_betas, _weight_decay, _freeze, _requires_grad,
                                    _replace_a_layer, _adam])
def test_an_adamw_step_sees_each_change_as_a_fresh_compile_does(batches, change):
    plain = _adamw_run(batches)
    changed = _adamw_run(batches, change)
    fresh = _adamw_run(batches, change, rebuild=True)
    assert changed[0] == fresh[0] and changed[0][2:] != plain[0][2:]
    for k in fresh[1]:
        np.testing.assert_array_equal(changed[1][k], fresh[1][k])


def test_inputs_of_another_type_but_the_same_shape_find_the_same_graph(batches, capsys):
    em.seed(0)
    model = Mlp()
    step = em.compile_train_step(model, nn.functional.cross_entropy, optim.AdamW(lr=1e-2),
                                 backend="cpu")
    x, y = batches[0]
    step(x, y)
    capsys.readouterr()
    step(x, y.tolist())  # no shape attribute: the key is built, and is the same
    step(x.view(type("Sub", (np.ndarray,), {})), y)  # an ndarray subclass
    step(x, y)
    assert "recompiling" not in capsys.readouterr().err and len(step._cache) == 1
    step(x[:4], y[:4])
    assert "recompiling" in capsys.readouterr().err and len(step._cache) == 2


def test_a_forward_compiled_for_a_spec_runs_arrays_without_recompiling(capsys):
    em.seed(0)
    model = Mlp()
    fn = em.compile(model, em.TensorSpec((8, 16), "f32"))
    capsys.readouterr()
    x = np.ones((8, 16), np.float32)
    a, b = fn(x), fn(x)
    np.testing.assert_array_equal(a, b)
    assert "recompiling" not in capsys.readouterr().err and len(fn._cache) == 1


def test_param_ids_hash_and_compare_by_value():
    a, b = ParamId(123456789), ParamId(123456789)
    assert a == b and hash(a) == hash(b) and a is not b
    assert {a: 1}[b] == 1 and ParamId(5) != ParamId(6) and ParamId(5) < ParamId(6)
    c = pickle.loads(pickle.dumps(a))
    assert c == a and hash(c) == hash(a) and str(c) == str(a)


def _set_value(flag):
    flag.set_value(False)


def _in_place(flag):
    flag.val()[()] = False


def _shared_state(flag):  # the value its clones share, which `val()` falls back on
    flag._state.value = np.array(False)


@pytest.mark.parametrize("edit,set_before", [
    (_set_value, False), (_set_value, True), (_in_place, False), (_in_place, True),
    (_shared_state, False)], ids=["set", "set-again", "in-place", "in-place-own", "shared"])
def test_state_watch_sees_a_flag_changed_however_it_is_set(edit, set_before):
    from ember.runtime.params import StateWatch, param_table

    em.seed(0)
    model = nn.Dropout(0.5)
    if set_before:
        model.train()  # the flag now holds its own array (`_value`), not its state's
    table = param_table(model)
    watch = StateWatch(table)
    assert watch.unchanged(table)
    edit(model.training)
    assert not watch.unchanged(table)
    assert StateWatch(table).unchanged(table)  # a new watch reads the new value


def test_state_watch_sees_requires_grad_and_ignores_values():
    from ember.runtime.params import StateWatch, param_table

    em.seed(0)
    model = Mlp()
    table = param_table(model)
    watch = StateWatch(table)
    model.fc1.weight.set_value(np.zeros((16, 32), np.float32))
    assert watch.unchanged(table) and not watch.unchanged(dict(table))
    model.fc2.bias.requires_grad = False
    assert not watch.unchanged(table)


def test_state_watch_reads_requires_grad_only_after_one_was_set():
    from ember.runtime.params import StateWatch, param_table

    em.seed(0)
    model = Mlp()
    table = param_table(model)
    watch = StateWatch(table)
    watch.params = ()  # a watch that read the Params again would now find none
    assert watch.unchanged(table)  # no requires_grad set since the watch: none read
    model.fc2.bias.requires_grad = True  # set (to what it was): read again
    assert not watch.unchanged(table)
    watch = StateWatch(table)
    model.fc2.bias.requires_grad = False
    model.fc2.bias.requires_grad = True  # set and set back: the same state
    assert watch.unchanged(table)
    watch.params = ()
    assert watch.unchanged(table)  # the count caught up: not read again
