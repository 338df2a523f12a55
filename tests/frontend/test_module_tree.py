"""The module tree: field classification, visit/map order, records and state transitions."""

from collections import namedtuple

import numpy as np
import pytest

import ember as em
from ember import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 8), nn.Linear(8, 8)]
        self.extra = None  # an absent optional: no path segment
        self.head = nn.Linear(8, 2, bias=False)
        self.name = "net"  # a constant: never visited
        self.sizes = [4, 8, 2]  # a list holding no module: a constant too

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.relu(layer(x))
        return self.head(x)


class Recorder(em.ModuleVisitor):
    def __init__(self):
        self.events = []

    def enter_module(self, name, container_type):
        self.events.append(("enter", name, container_type))

    def exit_module(self, name, container_type):
        self.events.append(("exit", name, container_type))

    def visit_float(self, param):
        self.events.append(("float", param.shape))

    def visit_flag(self, param):
        self.events.append(("flag", param.shape))

    def visit_buffer(self, param):
        self.events.append(("buffer", param.shape))


def _linear(weight, bias=None):
    param = lambda name, shape: [("enter", name, "Struct:Linear"), ("float", shape),  # noqa: E731
                                 ("exit", name, "Struct:Linear")]
    return param("weight", weight) + (param("bias", bias) if bias else [])


def test_visit_order_container_types_and_laziness():
    model = Net()
    events = model.visit(Recorder()).events
    assert events == [
        ("enter", "layers", "Struct:Net"),
        ("enter", "0", "List"), *_linear((4, 8), (8,)), ("exit", "0", "List"),
        ("enter", "1", "List"), *_linear((8, 8), (8,)), ("exit", "1", "List"),
        ("exit", "layers", "Struct:Net"),
        ("enter", "head", "Struct:Net"), *_linear((8, 2)), ("exit", "head", "Struct:Net"),
    ]
    assert [path for path, _ in model.named_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "head.weight"]
    assert model.num_params() == 4 * 8 + 8 + 8 * 8 + 8 + 8 * 2
    assert not any(p.is_initialized for p in model.parameters())


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = {"a": nn.Linear(2, 2, bias=False), 3: [nn.Linear(2, 1, bias=False)]}
        self.pair = (nn.Linear(2, 3, bias=False), em.Param((5,), em.init.Zeros()))
        self.point = namedtuple("Point", "x y")(em.Param((1,), em.init.Ones()), "constant")


def test_dict_tuple_and_nested_containers():
    model = Pair()
    assert [p for p, _ in model.named_parameters()] == [
        "blocks.a.weight", "blocks.3.0.weight", "pair.0.weight", "pair.1", "point.0"]
    events = model.visit(Recorder()).events
    assert ("enter", "a", "Dict") in events and ("enter", "0", "Tuple") in events
    assert ("enter", "0", "List") in events


class Zero(em.ModuleMapper):
    def map_float(self, param):
        return param.map(np.zeros_like)


def test_map_rebinds_params_in_every_container():
    model = Pair()
    ids = [p.id for p in model.parameters()]
    assert model.map(Zero()) is model
    assert [p.id for p in model.parameters()] == ids
    assert all(not p.val().any() for p in model.parameters())
    assert model.point.y == "constant" and type(model.point).__name__ == "Point"


def test_mapper_must_return_a_param():
    class Bad(em.ModuleMapper):
        def map_float(self, param):
            return param.val()

    with pytest.raises(TypeError, match="map_float returned ndarray"):
        Net().map(Bad())


def test_a_constant_hiding_a_module_is_an_error():
    model = Net()
    with pytest.raises(TypeError, match=r"Net\.bag: a set"):
        model.bag = {nn.Linear(1, 1)}
    model.later = set()
    model.later.add(nn.Linear(1, 1))
    with pytest.raises(TypeError, match=r"Net\.later"):
        model.num_params()


def test_containers_filled_after_assignment_are_visited():
    model = nn.Module()
    model.layers = []
    model.layers.append(nn.Linear(2, 2))
    assert [p for p, _ in model.named_parameters()] == ["layers.0.weight", "layers.0.bias"]


class Switch(nn.Module):
    """A module with a flag, standing in for Dropout."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.training = em.Param.flag(True)

    def forward(self, x):
        return self.fc(x) * 2.0 if self.training else self.fc(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Switch()
        self.b = Switch()


def _state(model):
    grads = {p.requires_grad for p in model.parameters()}
    flags = {bool(p) for _, p in model.all_params() if p.kind == "flag"}
    assert len(grads) == 1 and len(flags) == 1, (grads, flags)
    return grads.pop(), flags.pop()


@pytest.mark.parametrize("steps, grad, flag", [
    ([], True, True),
    (["valid"], True, False),
    (["valid", "train"], True, True),
    (["freeze"], False, False),
    (["freeze", "train"], False, False),
    (["freeze", "unfreeze"], True, False),
    (["freeze", "unfreeze", "train"], True, True),
    (["no_grad"], False, True),
    (["no_grad", "valid", "train"], False, True),
    (["eval"], True, False),  # PyTorch's names
    (["eval", "train"], True, True),
])
def test_state_transitions(steps, grad, flag):
    model = Model()
    for step in steps:
        assert getattr(model, step)() is model
    assert _state(model) == (grad, flag)


def test_train_takes_pytorchs_mode():
    model = Model()
    assert model.train(False) is model and _state(model) == (True, False)
    assert model.train(True) is model and _state(model) == (True, True)


def test_freezing_a_submodule_survives_train_of_the_whole_model():
    model = Model()
    model.a.freeze()
    model.valid().train()
    assert _state(model.a) == (False, False)
    assert _state(model.b) == (True, True)


def test_require_grad_groups():
    model = Model()
    model.set_require_grad_group(em.ParamGroup.from_predicate("a."), False)
    assert _state(model.a)[0] is False and _state(model.b)[0] is True
    model.set_require_grad_group(em.ParamGroup.from_predicate(lambda p: p.endswith("bias")), True)
    assert model.a.fc.bias.requires_grad and not model.a.fc.weight.requires_grad
    assert model.set_require_grad(True) is model and _state(model)[0] is True


def test_to_device_keeps_params_lazy_and_trainable():
    model = Net()
    ids = [p.id for p in model.parameters()]
    assert model.to_device("cuda:0") is model
    assert model.devices() == ["cuda:0"]
    assert [p.id for p in model.parameters()] == ids
    assert all(p.requires_grad and not p.is_initialized for p in model.parameters())


def test_clone_shares_lazy_state_but_not_updates():
    model = Net()
    twin = model.clone()
    w, w2 = model.head.weight, twin.head.weight
    assert w is not w2 and w.id == w2.id and twin.layers is not model.layers
    assert not w2.is_initialized
    w.val()
    assert w2.is_initialized and w2.val() is w.val()
    w2.set_value(np.zeros((8, 2)))
    assert w.val().any() and not w2.val().any()


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.running = em.Param((3,), em.init.Zeros(), kind="buffer")
        self.training = em.Param.flag(True)


def test_buffers_are_visited_counted_and_recorded_but_not_trained():
    model = WithBuffer()
    assert ("buffer", (3,)) in model.visit(Recorder()).events
    assert model.num_params() == 12 and model.num_buffers() == 3
    assert [p for p, _ in model.named_buffers()] == ["running"]
    assert not model.running.requires_grad
    assert sorted(model.state_dict()) == ["fc.bias", "fc.weight", "running"]
    assert len(model.params_by_id()) == 4


def test_state_dict_round_trip():
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    for (pa, x), (pb, y) in zip(a.named_parameters(), b.named_parameters()):
        assert pa == pb and np.array_equal(x.val(), y.val()) and x.id != y.id


def test_load_state_dict_strict_errors_change_nothing():
    model = Net()
    before = model.state_dict()
    state = dict(before)
    del state["head.weight"]
    state["layers.0.weight"] = np.zeros((5, 8), np.float32)
    state["layers.1.bias"] = np.zeros(8, np.float32)
    state["nope"] = np.zeros(1)
    with pytest.raises(ValueError) as e:
        model.load_state_dict(state)
    msg = str(e.value)
    assert "shape mismatch at layers.0.weight: got [5, 8], the model has [4, 8]" in msg
    assert "missing: head.weight" in msg and "unexpected: nope" in msg
    with pytest.raises(ValueError, match="shape mismatch"):
        model.load_state_dict(state, strict=False)
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    del state["layers.0.weight"]
    model.load_state_dict(state, strict=False)
    assert not model.layers[1].bias.val().any()


def test_repr_shows_the_tree_configs_and_counts():
    text = repr(Net())
    assert text.splitlines()[0] == "Net("
    assert "(0): Linear(d_in=4, d_out=8, bias=True)  # 40 params" in text
    assert "(head): Linear(d_in=8, d_out=2, bias=False)  # 16 params" in text
    assert text.endswith(")  # 128 params")
    assert "(1): Param([5], f32)  # 5 params" in repr(Pair())


@pytest.mark.parametrize("args, bad", [((0, 4), "d_in .* 0"), ((-3, 4), "d_in .* -3"),
                                       ((4, -1), "d_out .* -1"), ((2.5, 4), "2.5"),
                                       ((True, 4), "True")])
def test_linear_rejects_invalid_sizes(args, bad):
    with pytest.raises(ValueError, match=bad):
        nn.Linear(*args)


# -- TreeWatch: what makes the runtime walk a tree again ------------------------------------

def _watched(edit):
    """Whether a TreeWatch still says "unchanged" after `edit(net, spare)`; `spare` is a
    layer made before the watch, so only the edit itself can tell."""
    from ember.frontend.module import TreeWatch

    em.seed(0)
    net = Net()
    net.table = {"a": nn.Linear(2, 2)}
    spare = nn.Linear(8, 8)
    watch = TreeWatch(net)
    assert watch.unchanged()
    edit(net, spare)
    return watch.unchanged()


@pytest.mark.parametrize("edit", [
    lambda n, s: setattr(n, "head", s),                # a field reassigned
    lambda n, s: n.layers.append(s),                   # a list grown in place
    lambda n, s: n.layers.__setitem__(1, s),           # a list element replaced
    lambda n, s: n.sizes.append(s),                    # a constant list now holds one
    lambda n, s: n.table.update(b=s),                  # a dict grown in place
    lambda n, s: n.table.update(a=s),                  # a dict value replaced
    lambda n, s: n.layers[1].__delattr__("bias"),      # a field deleted deep down
    lambda n, s: n.map(type("M", (em.ModuleMapper,), {"map_float": lambda self, p: p.map(
        lambda v: v * 2)})()),                          # a mapper rebinds params
], ids=["field", "append", "setitem", "constant-list", "dict-grow", "dict-set", "delattr",
        "map"])
def test_tree_watch_sees_every_change_of_shape(edit):
    assert not _watched(edit)


def test_tree_watch_ignores_values_and_flags():
    def edit(n, _):
        n.head.weight.set_value(np.zeros((8, 2), np.float32))
        n.freeze()
        n.valid()

    assert _watched(edit)
