"""No kernel that `fuse` builds for a training step stores a value again at each point of
space dims it does not vary along (and does not reduce): an optimizer's updates share
scalars (its step count, lr, the loss scale), and every small param's update used to join
the kernel of the first large one that read them (a bias's AdamW run 65 times over an
embedding's rows). Counted on the step's graphs, for each optimizer path: fused, 16-mixed
(loss scaling), accumulated, data-parallel (its update graph), and sharded."""

from __future__ import annotations

import numpy as np
import pytest

import ember as em
from ember import nn, optim
from ember.ir import OPS, Graph
from ember.runtime.distributed import Communicator

VOCAB = 11


class Tiny(nn.Module):
    """An embedding (rows of VOCAB), a LayerNorm and a head: params of three shapes."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.emb, self.norm = nn.Embedding(VOCAB, d), nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB)

    def forward(self, x):
        return self.head(self.norm(self.emb(x)))


def loss_fn(logits, y):
    return nn.functional.cross_entropy(logits.reshape((-1, VOCAB)), y.reshape((-1,)))


def repeated_stores(graph: Graph) -> list[str]:
    """Each kernel result whose out map has stride 0 along a dim of the body's space
    larger than 1 that the body does not reduce."""
    found = []
    for op in graph.ops:
        if "space" not in op.attributes or "out_maps" not in op.attributes:
            continue
        space = OPS[op.name].body_space(op.attributes["space"])
        reduced = {d for inner in op.walk() if inner.name == "kernel.reduce"
                   for d in inner.attributes["dims"]}
        for k, m in enumerate(op.attributes["out_maps"]):
            if any(s == 0 and size > 1 and d not in reduced
                   for d, (size, s) in enumerate(zip(space, m))):
                found.append(f"{op.name} over {space}: result {k} (out map {m})")
    return found


CONFIGS = {
    "fused": {},
    "16-mixed": {"precision": "16-mixed"},
    "accumulate": {"accumulate": 2},
    "data-parallel": {"data_parallel": Communicator()},
    "sharded": {"data_parallel": Communicator(), "shard_optimizer": True},
}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("opt", ["adamw", "sgd"])
def test_no_kernel_stores_a_value_twice(config, opt):
    em.seed(0)
    optimizer = (optim.AdamW(lr=1e-3, weight_decay=0.1) if opt == "adamw"
                 else optim.SGD(lr=0.1, momentum=0.9, weight_decay=1e-4))
    step = em.compile_train_step(Tiny(), loss_fn, optimizer, backend="interpreter",
                                 **CONFIGS[config])
    x = np.random.default_rng(0).integers(0, VOCAB, (2, 5))
    for _ in range(2):
        step(x, x)
    graphs = [e.graph for e in step._cache.values()]
    graphs += [graph for graph, _, _ in getattr(step, "_updates", {}).values()]
    assert any(op.name.startswith("kernel.") for g in graphs for op in g.ops)
    assert [s for g in graphs for s in repeated_stores(g)] == []
