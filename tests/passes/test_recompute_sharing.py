"""Recompute shares its recomputed copies: a matmul runs at most once per backward
segment (strategy `all` used to rebuild a chain from the inputs for every value the
backward read, 289 recomputed matmuls on the 16-block MLP), no strategy plans a higher
peak than `none`, the values and gradients stay those of `none`, an attention's backward
still fuses into one kernel whatever is recomputed, and `all` picks its segments within
the step-time cap."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from model_graphs import mixed, mlp

import ember as em
from ember import nn
from ember.backends import interpreter
from ember.frontend.trace import TensorSpec, trace_function
from ember.ir import Graph, verify
from ember.passes import PassManager, PipelineError, parse_pipeline
from ember.passes.memory import plan_memory
from ember.passes.recompute import (
    MAX_SEGMENTS,
    STEP_CAP,
    Joint,
    Recompute,
    compute_bound,
)

F = nn.functional
STRATEGIES = ("none", "balanced", "min-cut", "all")


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, causal attention, an MLP, residuals."""

    def __init__(self, d: int):
        super().__init__()
        self.n1, self.attn = nn.LayerNorm(d), nn.MultiHeadAttention(d, 2, causal=True)
        self.n2, self.f1, self.f2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.f2(F.gelu(self.f1(self.n2(x))))


class Gpt(nn.Module):
    def __init__(self, d: int = 16, layers: int = 2):
        super().__init__()
        self.blocks = [Block(d) for _ in range(layers)]
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(axis=1))


def gpt() -> tuple[Graph, list, dict]:
    """The traced training graph of a 2-block GPT, its inputs and its param values."""
    em.seed(0)
    model = Gpt()
    shape = (2, 8, 16)
    g = trace_function(lambda x, y: F.cross_entropy(model(x), y), model,
                       (TensorSpec(shape, "f32"), TensorSpec((2,), "i64")), training=True)
    values = {str(p.id): p.val() for _, p in model.named_parameters()}
    rng = np.random.default_rng(0)
    return g, [rng.normal(size=shape).astype(np.float32), np.array([1, 3])], values


def tanh_mlp() -> tuple[Graph, list, dict]:
    net = mlp(5, 32, 16, activation="tanh")
    rng = np.random.default_rng(1)
    return net.graph, [rng.normal(size=(16, 32)).astype(np.float32),
                       rng.integers(0, 10, 16)], net.values()


MODELS = {"mlp": tanh_mlp, "gpt": gpt, "mixed": lambda: (mixed().graph, None, None)}


def recomputed(graph: Graph, strategy: str, segments: int = 0) -> Graph:
    seg = f" segments={segments}" if segments else ""
    return verify(PassManager(parse_pipeline(
        f"decompose,autodiff,recompute{{strategy={strategy}{seg}}}")).run(graph))


def matmuls(graph: Graph) -> int:
    return sum(op.name == "ember.matmul" for op in graph.ops)


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_all_recomputes_each_matmul_at_most_once_per_segment(name):
    none = matmuls(recomputed(MODELS[name]()[0], "none"))
    forward = matmuls(verify(PassManager(parse_pipeline("decompose")).run(MODELS[name]()[0])))
    for s in ("balanced", "min-cut"):
        assert matmuls(recomputed(MODELS[name]()[0], s)) == none, s
    for segments in (1, 2, 3):
        got = matmuls(recomputed(MODELS[name]()[0], "all", segments))
        assert none < got <= none + segments * forward, (segments, got, none)
    assert matmuls(recomputed(MODELS[name]()[0], "all")) <= none + MAX_SEGMENTS * forward


def test_each_compute_bound_op_is_copied_at_most_once_per_segment():
    graph = PassManager(parse_pipeline("decompose,autodiff,canonicalize,cse,dce")).run(gpt()[0])
    joint = Joint(graph)
    for segments in (1, 2, 4):
        s = joint.schedule(lambda op: False, segments)
        copies = collections.Counter(e.op for e in s.entries if e.clone and compute_bound(e.op))
        assert copies and max(copies.values()) <= segments, segments


@pytest.mark.parametrize("name", list(MODELS))
def test_no_strategy_plans_a_higher_peak_than_none(name):
    peaks = {s: plan_memory(recomputed(MODELS[name]()[0], s)).peak_bytes for s in STRATEGIES}
    for segments in (1, 3, 4):
        peaks[f"all/{segments}"] = plan_memory(
            recomputed(MODELS[name]()[0], "all", segments)).peak_bytes
    assert all(p <= peaks["none"] for p in peaks.values()), peaks
    assert peaks["all"] <= peaks["balanced"], peaks


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_values_and_gradients_are_nones(name):
    graph, inputs, values = MODELS[name]()
    want = interpreter.run(recomputed(graph, "none"), inputs, values)
    for s, segments in [(s, 0) for s in STRATEGIES[1:]] + [("all", 1), ("all", 3)]:
        got = interpreter.run(recomputed(MODELS[name]()[0], s, segments), inputs, values)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a, b), (s, segments)


def fused(strategy: str, segments: int = 0) -> Graph:
    """The gpt training graph as the training pipeline orders it, recomputed and fused."""
    seg = f" segments={segments}" if segments else ""
    return verify(PassManager(parse_pipeline(
        f"autodiff,decompose,recompute{{strategy={strategy}{seg}}},canonicalize,cse,dce,"
        "fuse")).run(gpt()[0]))


def test_attention_backward_fuses_under_every_strategy():
    """The fused attention backward recomputes p from q and k, so it forms only where p's
    copy and the dq, dk, dv products read the same q, k, v: `balanced` keeps them (it used
    to keep the scores and recompute q, k: 5 more matmuls per block, the scores stored),
    `all` shares one copy each per segment and cuts no segment inside an attention."""
    graph, inputs, values = gpt()
    want = interpreter.run(fused("none"), inputs, values)
    none_matmuls = None
    for s, segments in [(s, 0) for s in STRATEGIES] + [("all", 2), ("all", 3)]:
        g = fused(s, segments)
        names = collections.Counter(op.name for op in g.ops)
        assert names["kernel.attention_grad"] == len(Gpt().blocks), (s, segments, names)
        none_matmuls = none_matmuls or names["kernel.matmul"]
        if s in ("balanced", "min-cut"):
            assert names["kernel.matmul"] == none_matmuls, s
        got = interpreter.run(g, inputs, values)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.allclose(a, b, rtol=1e-5, atol=1e-6), (s, segments)


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_all_takes_the_lowest_peak_within_the_step_cap(name):
    """`all` trades step time for memory up to STEP_CAP times `none`'s modelled step work:
    more segments plan less memory but recompute more of the forward."""
    graph = PassManager(parse_pipeline("decompose,autodiff,canonicalize,cse,dce")).run(
        MODELS[name]()[0])
    joint = Joint(graph)
    step = joint.total_work(joint.forward + joint.backward)
    chosen = Recompute(strategy="all")._all(joint)
    within = [s for s in (joint.schedule(lambda op: False, n) for n in range(1, 5))
              if step + s.cost <= STEP_CAP * step]
    if within:
        assert step + chosen.cost <= STEP_CAP * step
        assert joint.peak(chosen) == min(map(joint.peak, within))
    else:  # one segment is already over the cap (the small GPT): the least recomputation
        assert chosen.cost == joint.schedule(lambda op: False, 1).cost


def test_segments_option():
    assert str(parse_pipeline("recompute{strategy=all segments=3}")[0]) == \
        "recompute{strategy=all segments=3}"
    with pytest.raises(PipelineError, match="segments must be >= 1"):
        parse_pipeline("recompute{segments=-1}")
