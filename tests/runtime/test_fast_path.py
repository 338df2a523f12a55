"""A training step on the cpu backend runs through its bound call path (runtime/fast_path.py):
it trains bit for bit as the general path (forced here by detect_anomaly) whatever changes
between steps, and keeps the contract that an array a step returned is never written again
while someone holds it."""

import functools

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.runtime.fast_path import BoundStep


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 4)
        self.norm = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.fc2(self.drop(nn.functional.relu(self.norm(self.fc1(x)))))


def loss_and_metric(out, y):
    return nn.functional.cross_entropy(out, y), out.mean()


def batches(n=6, rows=8):
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((rows, 12)).astype(np.float32), rng.integers(0, 4, rows))
            for _ in range(n)]


def replace_a_weight(model, step):
    model.fc2.weight.set_value(np.full(model.fc2.weight.shape, 0.01, np.float32))


def schedule_the_lr(model, step):
    step.optimizer.lr = optim.StepLR(0.05, step_size=1, gamma=0.5)


def swap_a_layer(model, step):
    em.seed(5)
    model.fc2 = nn.Linear(16, 4)


def new_optimizer(model, step):
    step.optimizer = optim.Adam(lr=1e-2)


def drop_the_state(model, step):
    step.optimizer.state.clear()


def change_a_weight_in_place(model, step):
    model.fc1.weight.val()[0] = 0.5


def reset_a_moment(model, step):
    slots = step.optimizer.state[model.fc1.weight.id]
    for name in slots:
        slots[name] = np.zeros_like(slots[name])


def delete_a_slot(model, step):
    slots = step.optimizer.state[model.fc2.weight.id]
    del slots[next(iter(slots))]  # made again (zeros), as the general path does


def replace_a_params_slots(model, step):
    state = step.optimizer.state
    state[model.fc2.bias.id] = {k: np.full_like(v, 0.1) for k, v in
                                state[model.fc2.bias.id].items()}


def freeze_then_replace_a_weight(model, step):
    if step.rng_step == 1:
        model.fc1.freeze()
    else:  # the frozen weight, bound by identity while it stays the same array
        model.fc1.weight.set_value(np.full(model.fc1.weight.shape, 0.02, np.float32))


def refill_the_same_input_arrays(model, step):
    # strided views, copied to contiguous arrays on every call (a copy is not kept)
    step.reused = np.zeros((12, 8), np.float32).T, np.zeros(16, np.int64)[::2]


def refill_the_same_contiguous_inputs(model, step):
    step.reused = np.zeros((8, 12), np.float32), np.zeros(8, np.int64)  # bound by identity


def refill_only_the_batch(model, step):
    step.reused = np.zeros((8, 12), np.float32), None  # one input kept, the other new


def run(general: bool, change=None, at=(3,), opt=lambda: optim.SGD(lr=0.1, momentum=0.9)):
    em.seed(0)
    model = Net()
    step = em.compile_train_step(model, loss_and_metric, opt(), backend="cpu",
                                 detect_anomaly=general)
    if not general:
        step.execute = lambda inputs: pytest.fail("the general path ran")
    out = []
    for i, (x, y) in enumerate(batches()):
        if i in at and change is not None:
            change(model, step)
        if hasattr(step, "reused"):
            fed = []
            for buffer, value in zip(step.reused, (x, y)):
                if buffer is not None:
                    buffer[:] = value
                fed.append(value if buffer is None else buffer)
            x, y = fed
        out.append(step(x, y))
    return out, {k: v.copy() for k, v in model.state_dict().items()}, step


@pytest.mark.parametrize("change,at", [
    (None, ()), (replace_a_weight, (3,)), (schedule_the_lr, (3,)), (swap_a_layer, (3,)),
    (new_optimizer, (3,)), (drop_the_state, (3,)), (change_a_weight_in_place, (3, 4)),
    (reset_a_moment, (3,)), (delete_a_slot, (3,)), (replace_a_params_slots, (3,)),
    (freeze_then_replace_a_weight, (1, 4)), (refill_the_same_input_arrays, (2,)),
    (refill_the_same_contiguous_inputs, (2,)), (refill_only_the_batch, (2,))])
def test_the_bound_path_trains_exactly_as_the_general_one(change, at):
    fast, general = run(False, change, at), run(True, change, at)
    assert fast[0] == general[0] and len(fast[0][0]) == 2  # (loss, metric) each step
    assert fast[1].keys() == general[1].keys()
    for k, v in general[1].items():
        np.testing.assert_array_equal(fast[1][k], v, err_msg=k)
    assert fast[2].rng_step == general[2].rng_step == 6
    assert fast[2].optimizer.step_count == general[2].optimizer.step_count


@pytest.mark.parametrize("opt", [optim.SGD, optim.AdamW])
def test_two_steps_on_one_model_called_in_turn_each_read_the_others_update(opt):
    """Each bound step skips looking at its Params while no value was rebound since it
    rebound them (`Edits.values`); a step's own rebinding counts too, so two compiled
    steps sharing the Params (and optimizer) find each other's results and train as the
    general path does."""
    def train(general):
        em.seed(0)
        model, optimizer = Net(), opt(lr=1e-2)
        steps = [em.compile_train_step(model, loss_and_metric, optimizer, backend="cpu",
                                       detect_anomaly=general) for _ in range(2)]
        losses = [steps[i % 2](x, y) for i, (x, y) in enumerate(batches())]
        return losses, {k: v.copy() for k, v in model.state_dict().items()}

    fast, general = train(False), train(True)
    assert fast[0] == general[0]
    for k, v in general[1].items():
        np.testing.assert_array_equal(fast[1][k], v, err_msg=k)


@pytest.mark.parametrize("change", [None, reset_a_moment, delete_a_slot, replace_a_params_slots,
                                    drop_the_state])
def test_two_slots_per_param_bind_as_one(change):
    """AdamW: each param's dict holds two slots, read in `ember.state` order."""
    adamw = functools.partial(optim.AdamW, lr=1e-2)
    fast, general = run(False, change, opt=adamw), run(True, change, opt=adamw)
    assert fast[0] == general[0]
    for k, v in general[1].items():
        np.testing.assert_array_equal(fast[1][k], v, err_msg=k)


class Tempered(Net):
    def __init__(self):
        super().__init__()
        self.temperature = em.Param.from_array(np.array(1.5, np.float32))

    def forward(self, x):
        return super().forward(x) / self.temperature


def test_a_0d_params_moments_are_scalars_fed_back():
    """AdamW's moments of a 0-d Param (a learnable temperature) are scalar inputs of the
    graph, which the bound call feeds back as it does the tensor slots."""
    def train(general):
        em.seed(0)
        model = Tempered()
        step = em.compile_train_step(model, loss_and_metric, optim.AdamW(lr=1e-2),
                                     backend="cpu", detect_anomaly=general)
        losses = [step(x, y) for x, y in batches()]
        return losses, model.temperature.val().copy(), step

    fast, general = train(False), train(True)
    assert fast[0] == general[0] and fast[1] == general[1] != 1.5
    assert fast[2]._repeating is not None


def test_inputs_of_another_kind_between_bound_steps_train_as_the_general_path():
    """The bound call binds the inputs in its entry, which refuses any it cannot read in
    place (another batch size, layout or labels' dtype): those steps take the general
    path."""
    data = batches(8)
    data[2] = data[2][0][:4], data[2][1][:4]  # each after two steps on the bound path
    data[5] = np.asfortranarray(data[5][0]), data[5][1]
    data[7] = data[7][0], data[7][1].astype(np.int32)
    losses = []
    for general in (False, True):
        em.seed(0)
        model = Net()
        step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=0.1),
                                     backend="cpu", detect_anomaly=general)
        losses.append([step(x, y) for x, y in data])
    assert losses[0] == losses[1]


def test_arrays_a_step_returned_are_current_or_untouched_while_held():
    """A param's array a user holds is either still the param's, updated in place (it
    reads the current value: backends/cpu/call/bound.py), or no longer written at all (it
    keeps the value it had): never a buffer the step reuses for another value."""
    em.seed(0)
    model = Net()
    step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=0.1), backend="cpu")
    data = batches()
    step(*data[0])
    held = [(p.val(), p.val().copy()) for p in model.parameters()]
    for b in data[1:]:
        step(*b)
    assert isinstance(step._last.bound, BoundStep)
    # (holding them all, every step is a general call: the bound one would write some)
    current = [value is p.val() for (value, _), p in zip(held, model.parameters())]
    for (value, copy), now in zip(held, current):
        if not now:
            np.testing.assert_array_equal(value, copy)
            assert all(value is not p.val() for p in model.parameters())


def test_a_nan_loss_leaves_params_and_counters_as_they_were():
    em.seed(0)
    model = Net()
    step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=1e30), backend="cpu")
    x, y = batches(1)[0]
    before = {k: v.copy() for k, v in model.state_dict().items()}
    with pytest.raises(FloatingPointError, match="params were not updated"):
        for _ in range(4):
            before = {k: v.copy() for k, v in model.state_dict().items()}
            counters = step.rng_step, step.optimizer.step_count
            step(x, y)
    assert (step.rng_step, step.optimizer.step_count) == counters
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


def test_a_frozen_param_reshaped_in_place_is_still_checked():
    """A param the step reads but does not update is bound by identity: its shape is
    checked again on every step all the same."""
    em.seed(0)
    model = Net()
    model.fc1.freeze()
    step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=0.1), backend="cpu")
    data = batches(3)
    for b in data:
        step(*b)
    model.fc1.bias.val().shape = (2, 8)
    with pytest.raises(ValueError, match="fc1.bias"):
        step(*data[0])


def test_an_updated_param_reshaped_in_place_is_refused():
    """A param the step updates is fed back without a look in Python: its shape set in
    place is still found before anything runs."""
    em.seed(0)
    model = Net()
    step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=0.1), backend="cpu")
    data = batches(3)
    for b in data:
        step(*b)
    weight = model.fc2.weight.val()
    before = weight.copy()
    weight.shape = weight.shape[::-1]
    with pytest.raises(ValueError, match="fc2.weight"):
        step(*data[0])
    np.testing.assert_array_equal(weight.reshape(before.shape), before)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # NumPy 2.4+: setting strides
def test_a_param_whose_strides_are_set_in_place_is_read_as_numpy_reads_it():
    """numpy lets a caller set a fed array's strides in place (here: the transpose of its
    data): the next steps read the values numpy shows, as for a contiguous copy of them;
    a step that kept the data pointer bound read the old layout."""
    losses = []
    for strided in (True, False):
        em.seed(0)
        model = Net()
        step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=0.1),
                                     backend="cpu")
        data = batches(3)
        for b in data:
            step(*b)
        weight = model.fc1.weight.val()
        rows, cols = weight.shape
        transposed = np.lib.stride_tricks.as_strided(weight, weight.shape,
                                                     (4, 4 * rows)).copy()
        if strided:
            weight.strides = (4, 4 * rows)
        else:
            weight[...] = transposed
        losses.append([step(*b) for b in data])
    assert losses[0] == losses[1]


@pytest.mark.parametrize("opt", [optim.SGD(lr=0.1, momentum=0.9), optim.AdamW(lr=1e-2)])
def test_after_the_first_step_the_executable_binds_nothing_again(opt):
    """Params, buffers and optimizer state a step returned are bound by the executable's
    feedback run (backends/cpu/call/bound.py) from the second step on: its general path
    never runs."""
    em.seed(0)
    model = Net()
    step = em.compile_train_step(model, loss_and_metric, opt, backend="cpu")
    data = batches()
    step(*data[0])
    exe = step._last.run
    exe._run = lambda *a: pytest.fail("the executable's general path ran")
    for b in data[1:]:
        step(*b)
    assert exe.native_calls == len(data)


@pytest.mark.parametrize("drop", [0.0, 0.25])  # with and without a random stream
def test_a_step_on_what_the_last_found_repeats_it_without_looking_up_again(drop):
    """From the second step on, a step whose tree, inputs' shapes, flags and settings are
    the last step's runs through `BoundStep.repeat`: neither the param table's walk nor
    `entry()`'s key is made again; a change (another batch size) still finds its graph."""
    em.seed(0)
    model = Net()
    model.drop = nn.Dropout(drop)
    step = em.compile_train_step(model, loss_and_metric, optim.SGD(lr=0.1), backend="cpu")
    data = batches(4)
    step(*data[0])
    step(*data[1])
    walk = step.param_table.__class__.__call__
    step.entry = lambda *a: pytest.fail("entry() ran")
    step.param_table.__class__.__call__ = lambda self: pytest.fail("the table was read")
    try:
        for x, y in data[2:]:
            step(x, y)
    finally:
        step.param_table.__class__.__call__ = walk
        del step.entry
    assert step.rng_step == 4 and step.optimizer.step_count == 4
    x, y = data[0]
    step(x[:4], y[:4])
    assert step._last.specs[0].shape == (4, 12)


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 4)

    def forward(self, idx):
        return self.emb(idx)


def test_a_step_whose_graph_asks_for_no_input_checks_repeats_too():
    """Token ids in, no labels, no float input: the graph asks the backend for no checks,
    so the cpu entry runs all of them (none) and the step takes `repeat` from its second
    call (it used to take `entry()` on every step, as if the checks were left to Python)."""
    em.seed(0)
    step = em.compile_train_step(Tokens(), lambda out: (out * out).mean(), optim.SGD(lr=0.1),
                                 backend="cpu")
    idx = np.arange(12).reshape(3, 4) % 6
    step(idx)
    assert step._last.native_checks and "ember.label_args" not in step._last.graph.attributes
    step(idx)
    step.entry = lambda *a: pytest.fail("entry() ran")
    try:
        losses = [step(idx) for _ in range(3)]
    finally:
        del step.entry
    assert losses == sorted(losses, reverse=True) and step.optimizer.step_count == 5
