"""IR dumps keep each op's source location and never overwrite an earlier dump of the
same function: a recompile for new shapes, or a second dump, gets the next number."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import ember as em
from ember import nn, optim
from ember.ir.parser import parse
from ember.ir.printer import strip_locations


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 16), nn.Linear(16, 10)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))  # FORWARD_LINE


FORWARD_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if line.endswith("# FORWARD_LINE"))


def test_a_recompile_and_a_second_dump_keep_the_first_files(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_DUMP_IR", str(tmp_path))
    em.seed(0)
    step = em.compile_train_step(Mlp(), nn.functional.cross_entropy, optim.SGD(lr=0.1),
                                 backend="interpreter")
    for rows in (4, 6):  # two batch sizes: two compiles of train_step
        step(np.zeros((rows, 64), np.float32), np.zeros(rows, np.int64))
    again = step.dump_ir(str(tmp_path))
    n = len(step.stages)
    first = sorted(tmp_path.glob("train_step.*.mlir"))
    second = sorted(tmp_path.glob("train_step-2.*.mlir"))
    assert len(first) == len(second) == n and len(again) == n
    assert [p.rsplit("/", 1)[-1] for p in again][0] == "train_step-3.00-traced.mlir"
    assert "tensor<4x64xf32>" in first[0].read_text()
    assert "tensor<6x64xf32>" in second[0].read_text()
    for path in first + second:
        text = path.read_text()
        assert f'test_dump_ir_files.py":{FORWARD_LINE}:0)' in text, path  # the model's line
        parse(text)  # and the dump still reads back
    traced = (tmp_path / "train_step-3.00-traced.mlir").read_text()
    assert step.ir("traced") == strip_locations(traced) and "loc(" not in step.ir("traced")
    assert step.ir("traced", debuginfo=True) == traced


def test_strip_locations_gives_what_printing_without_debuginfo_gives():
    from ember.ir.printer import print_graph

    graph = em.trace(Mlp(), em.TensorSpec((2, 64)))
    located = print_graph(graph, debuginfo=True)
    assert located != print_graph(graph) and strip_locations(located) == print_graph(graph)
