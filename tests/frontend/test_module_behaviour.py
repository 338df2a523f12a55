"""Module trees as users meet them: the visitor experiment, BatchNorm counts, init bounds,
reproducibility, the freeze table with Dropout, repr, and invalid configurations."""

import math

import numpy as np
import pytest

import ember as em
from ember import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(4, 8), nn.Linear(8, 8)]
        self.norm = nn.LayerNorm(8)
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(8, 2, bias=False)  # an optional field, present
        self.name = "net"

    def forward(self, x):
        for layer in self.layers:
            x = nn.functional.relu(layer(x))
        return self.head(self.dropout(self.norm(x)))


class Printer(em.ModuleVisitor):
    def __init__(self):
        self.lines, self.path = [], []

    def enter_module(self, name, container_type):
        self.lines.append(f"enter {name} {container_type}")
        self.path.append(name)

    def exit_module(self, name, container_type):
        self.path.pop()
        self.lines.append(f"exit {name}")

    def _param(kind):
        def visit(self, param):
            value = f" = {bool(param)}" if kind == "flag" else ""
            self.lines.append(f"  {kind} {'.'.join(self.path)} {list(param.shape)}{value}")
        return visit

    visit_float, visit_flag, visit_buffer = _param("float"), _param("flag"), _param("buffer")


VISITOR_EXPERIMENT = """\
enter layers Struct:Net
enter 0 List
enter weight Struct:Linear
  float layers.0.weight [4, 8]
exit weight
enter bias Struct:Linear
  float layers.0.bias [8]
exit bias
exit 0
enter 1 List
enter weight Struct:Linear
  float layers.1.weight [8, 8]
exit weight
enter bias Struct:Linear
  float layers.1.bias [8]
exit bias
exit 1
exit layers
enter norm Struct:Net
enter gamma Struct:LayerNorm
  float norm.gamma [8]
exit gamma
enter beta Struct:LayerNorm
  float norm.beta [8]
exit beta
exit norm
enter dropout Struct:Net
enter training Struct:Dropout
  flag dropout.training [] = True
exit training
exit dropout
enter head Struct:Net
enter weight Struct:Linear
  float head.weight [8, 2]
exit weight
exit head"""


def test_the_visitor_experiment():
    model = Net()
    lazy = [p for _, p in model.all_params() if p.kind == "float"]
    assert not any(p.is_initialized for p in lazy)
    assert "\n".join(model.visit(Printer()).lines) == VISITOR_EXPERIMENT
    assert model.num_params() == 144
    assert not any(p.is_initialized for p in lazy)


def test_batchnorm1d_counts_and_visitor_kinds():
    bn = nn.BatchNorm1d(8)
    assert bn.num_params() == 16 and bn.num_buffers() == 16
    lines = bn.visit(Printer()).lines
    assert [x.strip() for x in lines if x.startswith("  ")] == [
        "float gamma [8]", "float beta [8]", "buffer running_mean [8]",
        "buffer running_var [8]", "flag training [] = True"]
    assert not bn.running_mean.requires_grad and bn.gamma.requires_grad
    assert not any(p.is_initialized for p in (bn.gamma, bn.running_var))
    np.testing.assert_array_equal(bn.running_var.val(), np.ones(8))


def test_init_bounds():
    w = nn.Linear(256, 64).weight.val()
    assert np.abs(w).max() <= 0.0625 and np.abs(w).max() >= 0.99 * 0.0625
    x = nn.Linear(256, 64, init=em.init.XavierUniform()).weight.val()
    bound = math.sqrt(3) * math.sqrt(2 / 320)
    assert abs(bound - 0.13693) < 1e-5 and np.abs(x).max() <= bound
    assert np.abs(x).max() >= 0.99 * bound
    conv = nn.Conv2d(3, 8, 3)
    for p in (conv.weight, conv.bias):
        assert np.abs(p.val()).max() <= 1 / math.sqrt(27) and 1 / math.sqrt(27) < 0.19245 + 1e-5
    assert np.abs(conv.weight.val()).max() >= 0.9 * 0.19245
    assert conv.weight.shape == (8, 3, 3, 3)
    grouped = nn.Conv2d(4, 8, (3, 1), groups=2)
    assert grouped.weight.shape == (8, 2, 3, 1)
    assert np.abs(grouped.weight.val()).max() <= 1 / math.sqrt(6)
    with pytest.raises(ValueError, match="needs fan_in"):
        em.Param((3, 3), em.init.KaimingUniform())


def test_reproducible_whatever_the_read_order():
    em.seed(0)
    a = Net()
    em.seed(0)
    b = Net()
    pa, pb = a.named_parameters(), b.named_parameters()
    va = {path: p.val() for path, p in pa}
    vb = {path: p.val() for path, p in reversed(pb)}
    assert [p.id for _, p in pa] == [p.id for _, p in pb]
    assert all(np.array_equal(va[k], vb[k]) for k in va)


class LinearDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)
        self.dropout = nn.Dropout(0.5)


@pytest.mark.parametrize("steps, requires_grad, flag", [  # frontend/module.py's transitions
    ([], True, True),
    (["valid"], True, False),
    (["valid", "train"], True, True),
    (["freeze"], False, False),
    (["freeze", "train"], False, False),
    (["no_grad"], False, True),
    (["no_grad", "valid", "train"], False, True),
])
def test_the_freeze_table(steps, requires_grad, flag):
    model = LinearDropout()
    for step in steps:
        assert getattr(model, step)() is model
    assert {p.requires_grad for p in model.parameters()} == {requires_grad}
    assert bool(model.dropout.training) is flag


def test_repr_shows_configs_and_counts():
    text = repr(Net())
    assert "(norm): LayerNorm(shape=[8], eps=1e-05)  # 16 params" in text
    assert "(dropout): Dropout(p=0.1)" in text
    assert text.endswith(")  # 144 params")
    bn = repr(nn.Sequential(nn.Conv2d(3, 8, 3, padding="same"), nn.BatchNorm2d(8)))
    assert ("(0): Conv2d(c_in=3, c_out=8, kernel_size=(3, 3), stride=(1, 1), padding='same', "
            "dilation=(1, 1), groups=1, bias=True)  # 224 params") in bn
    assert "(1): BatchNorm2d(num_features=8, eps=1e-05, momentum=0.1)  # 16 params, 16 buffers" \
        in bn


@pytest.mark.parametrize("make, message", [
    (lambda: nn.Dropout(1.5), r"dropout probability p must be a finite number in \[0, 1\], "
                              r"got 1.5"),
    (lambda: nn.Dropout(float("nan")), "got nan"),
    (lambda: nn.Dropout(-0.1), "got -0.1"),
    (lambda: nn.Conv2d(3, 8, 3, groups=2), "groups=2 must divide c_in=3 and c_out=8"),
    (lambda: nn.Conv2d(-3, 8, 3), "Conv2d c_in must be a positive integer, got -3"),
    (lambda: nn.Conv2d(3, 8, 0), "kernel_size must be an integer >= 1 or a pair of them, got 0"),
    (lambda: nn.Conv2d(3, 8, 3, stride=2, padding="same"), "'same' needs stride 1"),
    (lambda: nn.Conv2d(3, 8, 3, padding="full"), "got 'full'"),
    (lambda: nn.Conv2d(3, 8, 3, padding=-1), "got -1"),
    (lambda: nn.Conv1d(3, 8, 3, groups=3), "groups=3 must divide c_in=3 and c_out=8"),
    (lambda: nn.ConvTranspose2d(3, 8, 3, stride=2, output_padding=2),
     r"output_padding \(2, 2\) must be smaller than stride \(2, 2\)"),
    (lambda: nn.LayerNorm(0), "LayerNorm size must be a positive integer, got 0"),
    (lambda: nn.LayerNorm(8, eps=0.0), "eps must be positive, got 0.0"),
    (lambda: nn.GroupNorm(3, 8), "num_groups=3 must divide num_channels=8"),
    (lambda: nn.BatchNorm1d(-2), "num_features must be a positive integer, got -2"),
    (lambda: nn.BatchNorm2d(4, momentum=1.5), r"momentum must be a finite number in \[0, 1\]"),
    (lambda: nn.Embedding(0, 4), "num_embeddings must be a positive integer, got 0"),
    (lambda: nn.MaxPool2d(2, padding=2), r"padding \(2, 2\) must be at most half"),
    (lambda: nn.AvgPool2d((2, -1)), r"got \(2, -1\)"),
    (lambda: nn.AdaptiveAvgPool2d(0), "output_size must be an integer >= 1"),
    (lambda: nn.GELU("fast"), "got 'fast'"),
    (lambda: nn.MultiHeadAttention(10, 3), "num_heads=3 must divide d_model=10"),
])
def test_invalid_configs_fail_at_construction_naming_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()
