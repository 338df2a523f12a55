"""A recomputed pipeline keeps its strategy only where the finished graph (fused, with
the optimizer's update) plans less memory than its fallback's. An 8-layer tanh MLP on a
small batch peaks at the end of the backward, where grads and momentum meet the copies a
recomputed backward recomputes, so "balanced" and "all" run none's schedule there; a
transformer block's recomputing pays and stays. Values are none's either way; the stage
names are the requested pipeline's."""

from __future__ import annotations

import numpy as np
import pytest
from small_models import Block

import ember as em
from ember import nn, optim
from ember.frontend.trace import TensorSpec, trace_function
from ember.ir.memory_plan import plan_memory
from ember.passes import parse_pipeline
from ember.runtime.pipeline import Stages, candidates, training_pipeline

F = nn.functional


class Tanh(nn.Module):
    def __init__(self, width: int = 128, depth: int = 8):
        super().__init__()
        self.layers = [nn.Linear(width, width) for _ in range(depth)]
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        for layer in self.layers:
            x = F.tanh(layer(x))
        return self.head(x)


def stages(model: nn.Module, shape: tuple, strategy: str) -> Stages:
    em.seed(0)
    m = model()
    g = trace_function(lambda x, y: F.cross_entropy(m(x), y), m,
                       (TensorSpec(shape, "f32"), TensorSpec((shape[0],), "i64")),
                       training=True)
    return Stages(g, training_pipeline(optim.SGD(lr=0.1, momentum=0.9).pass_spec(),
                                       recompute=strategy))


def test_candidates_fall_back_from_all_to_balanced_to_none():
    got = [[p.strategy for p in c if p.name == "recompute"]
           for c in candidates(parse_pipeline("autodiff,recompute{strategy=all},fuse"))]
    assert got == [["all"], ["balanced"], ["none"]]
    budget = parse_pipeline("autodiff,recompute{strategy=min-cut budget=1000},fuse")
    assert candidates(budget) == [budget]  # a budget is what was asked for
    assert len(candidates(parse_pipeline("autodiff,fuse"))) == 1


@pytest.mark.parametrize("model, shape, kept", [(Tanh, (32, 128), "none"),
                                                (Block, (16, 16, 32), "all")])
def test_a_strategy_is_kept_only_where_it_plans_less_after_fusion(model, shape, kept):
    none = plan_memory(stages(model, shape, "none").graph).peak_bytes
    got = {s: stages(model, shape, s) for s in ("balanced", "all")}
    for s, st in got.items():
        assert plan_memory(st.graph).peak_bytes <= none, s
        assert "recompute" in st.names  # the requested pipeline's stages
        ran = st.graph.attributes["ember.recompute_strategy"]
        assert f'ember.recompute_strategy = "{ran}"' in st.text("recompute")  # texts: the one run
        assert st.unfused().attributes["ember.recompute_strategy"] == ran
    assert got["all"].graph.attributes["ember.recompute_strategy"] in (kept, "balanced")
    if kept == "none":
        assert {st.graph.attributes["ember.recompute_strategy"] for st in got.values()} == {"none"}
    else:
        assert plan_memory(got["balanced"].graph).peak_bytes < none


def test_a_fallen_back_step_trains_exactly_like_none():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 128)).astype(np.float32), rng.integers(0, 10, 32)
    params = {}
    for s in ("none", "all"):
        em.seed(0)
        model = Tanh()
        step = em.compile_train_step(model, F.cross_entropy, optim.SGD(lr=0.1, momentum=0.9),
                                     backend="interpreter", recompute=s)
        losses = [step(x, y) for _ in range(2)]
        assert step.graph.attributes.get("ember.recompute_strategy", "none") == "none"
        params[s] = [p.val() for p in model.parameters()], losses
    assert params["all"][1] == params["none"][1]
    for a, b in zip(params["all"][0], params["none"][0]):
        np.testing.assert_array_equal(a, b)
