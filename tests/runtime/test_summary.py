"""`em.summary(model, *example_inputs)`: one row per module call with its output shape,
params and FLOPs, from one trace that initializes nothing."""

from __future__ import annotations

import numpy as np

import ember as em
from ember import nn
from ember.ir.opdef import ops_with
from ember.runtime.summary import MACS


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.drop = nn.Dropout(0.5)
        self.blocks = [nn.Linear(256, 32), nn.Linear(32, 32)]
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 10, bias=False)

    def forward(self, x):
        x = self.drop(nn.functional.relu(self.conv(x))).reshape((x.shape[0], 256))
        for block in self.blocks:
            x = nn.functional.relu(block(x))
        return self.head(self.norm(x))


def test_rows_shapes_params_and_flops():
    em.seed(0)
    model = Net().valid()  # dropout off: it makes no op
    s = em.summary(model, np.zeros((8, 1, 8, 8), np.float32))
    rows = {r.path: r for r in s.rows}
    assert [r.path for r in s.rows] == ["", "conv", "drop", "blocks.0", "blocks.1", "norm",
                                        "head"]
    assert [r.depth for r in s.rows] == [0, 1, 1, 1, 1, 1, 1]
    assert rows["conv"].output == (8, 4, 8, 8) and rows["drop"].output is None
    assert rows["blocks.1"].output == (8, 32) and rows[""].output == (8, 10)
    assert rows["conv"].params == 4 * 9 + 4 and rows["head"].params == 320
    assert rows[""].params == s.params == model.num_params()
    assert rows["conv"].flops == 2 * (8 * 4 * 8 * 8) * 9
    assert rows["head"].flops == 2 * 8 * 32 * 10
    assert rows["blocks.0"].flops == 2 * 8 * 256 * 32
    assert s.flops == rows[""].flops > sum(rows[p].flops for p in ("conv", "blocks.0", "head"))
    assert s.param_bytes == 4 * s.params and s.trainable == s.params
    assert not any(p.is_initialized for p in model.parameters())
    text = str(s)
    assert "  blocks.0 (Linear)" in text and "[8, 4, 8, 8]" in text and "Net" in text
    assert f"Total params: {s.params:,}" in text


def test_frozen_params_are_not_trainable():
    model = Net()
    model.conv.freeze()
    s = em.summary(model, em.TensorSpec((2, 1, 8, 8)))
    assert s.trainable == s.params - model.conv.num_params()


def test_every_compute_bound_op_has_a_flop_rule():
    bound = {name for d in ("ember", "nn") for name in ops_with("compute_bound", d)}
    assert bound <= MACS.keys(), sorted(bound - MACS.keys())
