"""nn.ModuleList and nn.ModuleDict: PyTorch's containers, walked as plain lists and dicts
are (same visitor events, same paths), so everything built on the walks (counts, records,
state transitions, map, clone, TreeWatch, repr, summary, load_torch) treats them alike."""

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.frontend.module import TreeWatch
from ember.frontend.records import load, load_torch, save


class Net(nn.Module):
    """The same model with plain containers or with PyTorch's (`torch_style`)."""

    def __init__(self, torch_style: bool):
        super().__init__()
        layers = [nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 8)]
        blocks = {"attn": nn.Linear(8, 8), "mlp": nn.Linear(8, 2, bias=False)}
        self.layers = nn.ModuleList(layers) if torch_style else layers
        self.blocks = nn.ModuleDict(blocks) if torch_style else blocks

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.blocks["mlp"](nn.functional.relu(self.blocks["attn"](x)))


PATHS = ["layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias",
         "blocks.attn.weight", "blocks.attn.bias", "blocks.mlp.weight"]


class Recorder(em.ModuleVisitor):
    def __init__(self):
        self.events, self.modules = [], []

    def enter_module(self, name, container_type):
        self.events.append(("enter", name, container_type))

    def exit_module(self, name, container_type):
        self.events.append(("exit", name, container_type))

    def visit_module(self, module):
        self.modules.append(type(module).__name__)

    def visit_float(self, param):
        self.events.append(("float", param.shape))

    def visit_flag(self, param):
        self.events.append(("flag", param.shape))


def test_visitor_events_and_paths_are_a_plain_containers():
    plain, torch_style = Net(False), Net(True)
    a, b = plain.visit(Recorder()), torch_style.visit(Recorder())
    assert a.events == b.events
    assert ("enter", "0", "List") in b.events and ("enter", "attn", "Dict") in b.events
    assert [p for p, _ in torch_style.named_parameters()] == PATHS
    assert torch_style.num_params() == plain.num_params() == 4 * 8 + 8 + 72 + 72 + 16
    assert not any(p.is_initialized for p in torch_style.parameters())  # counting is lazy
    assert sorted(torch_style.state_dict()) == sorted(plain.state_dict())
    # unlike a plain container, PyTorch's is a module of its own (as in torch)
    assert b.modules == ["ModuleList", "Linear", "Dropout", "Linear", "ModuleDict", "Linear",
                         "Linear"]
    assert [p for p, _ in torch_style.named_modules()][:3] == ["", "layers", "layers.0"]


def test_module_list_behaves_as_pytorchs():
    a, b, c, d = (nn.Linear(2, 2) for _ in range(4))
    ml = nn.ModuleList([a, b])
    assert len(ml) == 2 and list(ml) == [a, b] and ml[0] is a and ml[-1] is b and ml[-2] is a
    assert ml.append(c) is ml and ml[2] is c
    ml.extend([d])
    ml.insert(1, d)
    assert list(ml) == [a, d, b, c, d]
    part = ml[1:4]
    assert isinstance(part, nn.ModuleList) and list(part) == [d, b, c] and ml[::-2][0] is d
    ml[0] = c
    del ml[1]
    assert list(ml) == [c, b, c, d] and ml.pop() is d and ml.pop(0) is c and list(ml) == [b, c]
    ml += [a]
    assert list(ml) == [b, c, a] and list(ml + nn.ModuleList([d])) == [b, c, a, d]
    assert len(nn.ModuleList()) == 0 and not nn.ModuleList()
    assert isinstance(ml, nn.Module) and ml.num_params() == 3 * 6
    with pytest.raises(IndexError, match="ModuleList index 3 is out of range for 3 modules"):
        ml[3]
    with pytest.raises(IndexError, match="index -4 is out of range"):
        ml[-4] = a
    with pytest.raises(TypeError, match="ModuleList holds Modules; the new element is a int"):
        ml.append(3)
    with pytest.raises(TypeError, match="element 1 is a Param"):
        ml.extend([a, em.Param((2,), em.init.Zeros())])
    assert list(ml) == [b, c, a]  # a refused extend changes nothing


def test_module_dict_behaves_as_pytorchs():
    a, b, c = (nn.Linear(2, 2) for _ in range(3))
    md = nn.ModuleDict({"a": a, "b": b})
    assert len(md) == 2 and list(md) == ["a", "b"] and "a" in md and "z" not in md
    assert md["a"] is a and md.b is b  # attribute access, as in torch
    assert list(md.keys()) == ["a", "b"] and list(md.values()) == [a, b]
    assert list(md.items()) == [("a", a), ("b", b)]
    md.update([("c", c), ("a", c)])
    md["d"] = a
    assert list(md.items()) == [("a", c), ("b", b), ("c", c), ("d", a)]
    assert md.pop("d") is a
    del md["c"]
    assert list(md) == ["a", "b"] and isinstance(md, nn.Module)
    assert list(nn.ModuleDict(md).items()) == list(md.items())
    with pytest.raises(KeyError):
        md["zz"]
    with pytest.raises(AttributeError, match="no attribute or key 'zz'"):
        getattr(md, "zz")  # noqa: B009
    with pytest.raises(TypeError, match="keys are strings, got a int: 3"):
        md[3] = a
    with pytest.raises(ValueError, match="'x.y': a key is a non-empty path segment"):
        md.update({"ok": a, "x.y": b})
    with pytest.raises(TypeError, match="ModuleDict holds Modules; key 'w' is a ndarray"):
        md["w"] = np.zeros(2)
    assert list(md) == ["a", "b"]  # a refused update changes nothing
    md.clear()
    assert len(md) == 0 and md.num_params() == 0


def test_state_transitions_map_clone_and_device_reach_the_elements():
    model = Net(True)
    assert not bool(model.valid().layers[1].training)
    assert bool(model.train().layers[1].training)
    model.layers.freeze()
    assert not any(p.requires_grad for p in model.layers.parameters())
    assert all(p.requires_grad for p in model.blocks.parameters())
    assert not bool(model.train().layers[1].training)  # frozen survives train()
    model.unfreeze()
    model.set_require_grad_group(em.ParamGroup.from_predicate("blocks.attn."), False)
    assert [p for p, x in model.named_parameters() if not x.requires_grad] == [
        "blocks.attn.weight", "blocks.attn.bias"]
    ids = [p.id for p in model.parameters()]
    model.map(type("Zero", (em.ModuleMapper,), {"map_float": lambda s, p: p.map(np.zeros_like)})())
    assert [p.id for p in model.parameters()] == ids
    assert not any(p.val().any() for p in model.parameters())
    twin = model.clone()
    assert twin.layers is not model.layers and twin.blocks.attn is not model.blocks.attn
    assert [p.id for p in twin.parameters()] == ids and type(twin.blocks) is nn.ModuleDict
    assert model.to_device("cuda:0").devices() == ["cuda:0"]


def test_state_dicts_and_records_are_interchangeable_with_plain_containers(tmp_path):
    plain, torch_style = Net(False), Net(True)
    torch_style.load_state_dict(plain.state_dict())
    save(plain, tmp_path / "plain.safetensors")
    again = load(Net(True), tmp_path / "plain.safetensors")
    for (path, p), (_, q), (_, r) in zip(plain.named_parameters(),
                                         torch_style.named_parameters(),
                                         again.named_parameters()):
        assert np.array_equal(p.val(), q.val()) and np.array_equal(p.val(), r.val()), path
        assert r.id == p.id  # records restore ids


def test_tree_watch_sees_every_change_of_a_container():
    def changed(edit):
        em.seed(0)
        net, spare = Net(True), nn.Linear(8, 8)
        watch = TreeWatch(net)
        assert watch.unchanged()
        edit(net, spare)
        return not watch.unchanged()

    edits = [lambda n, s: n.layers.append(s), lambda n, s: n.layers.__setitem__(0, s),
             lambda n, s: n.layers.insert(0, s), lambda n, s: n.layers.pop(),
             lambda n, s: n.layers.__delitem__(slice(0, 1)), lambda n, s: n.layers.extend([s]),
             lambda n, s: n.blocks.update({"x": s}), lambda n, s: n.blocks.__setitem__("attn", s),
             lambda n, s: n.blocks.pop("attn"), lambda n, s: n.blocks.clear()]
    assert all(changed(e) for e in edits)
    assert not changed(lambda n, s: (list(n.layers), n.blocks["attn"], len(n.blocks)))


def test_repr_and_summary_show_pytorchs_names():
    text = repr(Net(True))
    assert "(layers): ModuleList(" in text and "(blocks): ModuleDict(" in text
    assert "  (attn): Linear(d_in=8, d_out=8, bias=True)  # 72 params" in text
    assert "(0): Linear(d_in=4, d_out=8, bias=True)  # 40 params" in text
    rows = em.summary(Net(True).valid(), em.TensorSpec((3, 4))).rows
    assert [r.path for r in rows] == ["", "layers.0", "layers.1", "layers.2", "blocks.attn",
                                      "blocks.mlp"]
    assert rows[-1].output == (3, 2)


def test_a_model_with_containers_compiles_and_trains_as_with_plain_ones():
    losses = {}
    for torch_style in (False, True):
        em.seed(3)
        model = Net(torch_style).valid()
        x = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
        step = em.compile_train_step(model, lambda out, y: ((out - y) ** 2).mean(),
                                     optim.SGD(lr=0.1), backend="interpreter")
        losses[torch_style] = [step(x, np.ones((6, 2), np.float32)) for _ in range(3)]
        assert losses[torch_style][-1] < losses[torch_style][0]
    assert losses[False] == losses[True]


def test_load_torch_maps_pytorchs_container_keys_one_to_one():
    torch = pytest.importorskip("torch")

    class TorchNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 8), torch.nn.Dropout(0.5),
                                               torch.nn.Linear(8, 8)])
            self.blocks = torch.nn.ModuleDict({"attn": torch.nn.Linear(8, 8),
                                               "mlp": torch.nn.Linear(8, 2, bias=False)})

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.blocks["mlp"](torch.relu(self.blocks["attn"](x)))

    tn = TorchNet().eval()
    assert sorted(tn.state_dict()) == sorted(PATHS)
    model = Net(True).valid()
    report = load_torch(model, tn.state_dict())
    assert sorted(report.loaded) == sorted(PATHS) and not report.ignored
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    out = em.compile(model, x, backend="interpreter")(x)
    np.testing.assert_allclose(out, tn(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
