"""`fuse` turns a decomposed attention and its backward into kernel.attention and
kernel.attention_grad: the fused graph computes what the unfused one does (interpreter),
every form it cannot fuse is left unfused with the same values, recomputed graphs fuse
the recomputed copy of p against its forward, and results the graph reads transposed are
written in that layout (no copy kernel)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gradcheck import build
from model_graphs import mixed

from ember.backends import interpreter
from ember.ir import verify
from ember.ir.parser import parse
from ember.passes import PassManager, parse_pipeline

GRAD = "autodiff,decompose,canonicalize,cse,dce"


def run_pipeline(graph, pipeline: str):
    return verify(PassManager(parse_pipeline(pipeline), verify_each=True).run(
        parse(str(graph))))


def names(g) -> list[str]:
    return [op.name for op in g.ops]


def fused_and_unfused(graph, pipeline: str = GRAD):
    return (run_pipeline(graph, pipeline + ",fuse"),
            run_pipeline(graph, pipeline + ",fuse{attention=false}"))


def agree(fused, unfused, inputs, params, rtol=1e-10):
    want = interpreter.run(unfused, inputs, params)
    got = interpreter.run(fused, inputs, params)
    for k, (x, y) in enumerate(zip(got, want)):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=rtol, err_msg=f"output {k}")


def heads(b, x, h):
    """[B, T, H*D] -> [B, H, T, D], as multi-head attention splits its projections."""
    bsz, t, hd = x.type.shape
    r = b.op("ember.reshape", x, shape=[bsz, t, h, hd // h])
    return b.op("ember.transpose", r, perm=[0, 2, 1, 3])


def case(tq=5, tk=5, d=4, dv=4, causal=True, split=False, seed=0):
    """q, k, v as args; with `split`, [B, T, H*D] inputs split into 3 heads."""
    rng = np.random.default_rng(seed)
    if split:
        shapes = [(2, tq, 3 * d), (2, tk, 3 * d), (2, tk, 3 * dv)]
    else:
        shapes = [(2, 3, tq, d), (2, 3, tk, d), (2, 3, tk, dv)]
    args = [rng.normal(size=s) for s in shapes]

    def fn(b, q, k, v):
        if split:
            q, k, v = (heads(b, x, 3) for x in (q, k, v))
        return b.op("nn.attention", q, k, v, causal=causal, scale=1 / math.sqrt(d))
    return fn, args


@pytest.mark.parametrize("wrt", [{0, 1, 2}, {2}, {0}, {1, 2}, {0, 1}])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_and_its_backward_fuse_to_two_kernels(wrt, causal):
    fn, args = case(causal=causal)
    graph = build(fn, args, wrt)
    fused, unfused = fused_and_unfused(graph)
    ops = names(fused)
    assert ops.count("kernel.attention") == 1 and ops.count("kernel.attention_grad") == 1
    assert not any(op.name == "kernel.matmul" and op.results[0].type.shape[-2:] == (5, 5)
                   for op in fused.ops), "the scores are still a matmul result"
    inputs = [a for i, a in enumerate(args) if i not in wrt]
    agree(fused, unfused, inputs, {f"p{i}": args[i] for i in wrt})


@pytest.mark.parametrize("shape", [dict(tq=3, tk=7), dict(tq=7, tk=3), dict(d=4, dv=6),
                                   dict(tq=1, tk=4, d=1, dv=2)])
@pytest.mark.parametrize("split", [False, True])
def test_odd_shapes_and_strided_heads_fuse(shape, split):
    fn, args = case(split=split, **shape)
    graph = build(fn, args, {0, 1, 2})
    fused, unfused = fused_and_unfused(graph)
    att = [op for op in fused.ops if op.name == "kernel.attention"]
    assert len(att) == 1
    if split:  # q, k, v are read in place from the [B, T, H*D] buffers
        assert all(v.type.rank == 3 for v in att[0].operands)
    agree(fused, unfused, [], {f"p{i}": a for i, a in enumerate(args)})


def test_inference_graph_fuses_the_forward_only():
    fn, args = case(split=True)
    graph = build(fn, args, set())
    fused, unfused = fused_and_unfused(graph, "decompose,canonicalize,cse,dce")
    assert "kernel.attention" in names(fused) and "kernel.attention_grad" not in names(fused)
    agree(fused, unfused, args, {})


def test_f32_fuses_and_agrees():
    fn, args = case(split=True)
    graph = build(fn, args, {0, 1, 2}, dtype="f32")
    fused, unfused = fused_and_unfused(graph)
    assert "kernel.attention_grad" in names(fused)
    agree(fused, unfused, [], {f"p{i}": a.astype(np.float32) for i, a in enumerate(args)},
          rtol=1e-5)


@pytest.mark.parametrize("strategy", ["none", "balanced", "min-cut", "all"])
def test_recomputing_training_graph_fuses_the_recomputed_copy(strategy):
    net = mixed()
    pipeline = f"autodiff,decompose,recompute{{strategy={strategy}}},optimizer,{GRAD[9:]}"
    fused, unfused = fused_and_unfused(net.graph, pipeline)
    assert names(fused).count("kernel.attention_grad") == 1, strategy
    rng = np.random.default_rng(1)
    inputs = [rng.normal(size=a.type.shape).astype(np.float32) if a.type.is_float else
              rng.integers(0, 5, a.type.shape) for a in fused.args]
    agree(fused, unfused, inputs, net.values(), rtol=1e-4)


def merged(b, o):
    """[B, H, T, D] -> [B, T, H*D] and a projection, as multi-head attention merges heads."""
    bsz, h, t, d = o.type.shape
    x = b.op("ember.reshape", b.op("ember.transpose", o, perm=[0, 2, 1, 3]),
             shape=[bsz, t, h * d])
    w = np.random.default_rng(5).normal(size=(h * d, 4))
    return b.op("ember.matmul", x, b.op("ember.constant", value=w))


def copies(g) -> list:
    """Kernels that only move elements: a body that yields its argument."""
    return [op for op in g.ops if op.name == "kernel.fused"
            and [x.name for x in op.regions[0].blocks[0].ops] == ["kernel.yield"]]


@pytest.mark.parametrize("causal", [True, False])
def test_results_are_written_in_the_layout_the_merged_heads_read(causal):
    """o goes to the projection as [B, T, H*D], dq, dk, dv back to the [B, T, H*D] inputs:
    each is written as [B, T, H, D] (lse stays [B, H, T]), so no transpose is copied."""
    fn, args = case(causal=causal, split=True, dv=6)
    graph = build(lambda b, *xs: merged(b, fn(b, *xs)), args, {0, 1, 2})
    fused, unfused = fused_and_unfused(graph)
    att = {op.name: op for op in fused.ops if op.name.startswith("kernel.attention")}
    assert [r.type.shape for r in att["kernel.attention"].results] == [(2, 5, 3, 6), (2, 3, 5)]
    assert [r.type.shape for r in att["kernel.attention_grad"].results] == [
        (2, 5, 3, 4), (2, 5, 3, 4), (2, 5, 3, 6)]
    assert att["kernel.attention_grad"].operands[3] is att["kernel.attention"].results[0]
    assert not copies(fused)
    agree(fused, unfused, [], {f"p{i}": a for i, a in enumerate(args)})


def test_a_result_read_in_two_layouts_stays_contiguous():
    """o read both as [B, T, H, D] and transposed [B, H, D, T]: no one layout serves both,
    so the forward writes it as before; the gradients, read one way, still fold."""
    fn, args = case(split=True)

    def two_ways(b, q, k, v):
        o = fn(b, q, k, v)
        sums = [b.op("ember.reduce_sum", b.op("ember.transpose", o, perm=p), axes=[0, 1, 2, 3],
                     keepdims=False) for p in ([0, 2, 1, 3], [0, 1, 3, 2])]
        return b.op("ember.add", *sums)
    graph = build(two_ways, args, {0, 1, 2})
    fused, unfused = fused_and_unfused(graph)
    fwd, = (op for op in fused.ops if op.name == "kernel.attention")
    grad, = (op for op in fused.ops if op.name == "kernel.attention_grad")
    assert "out_maps" not in fwd.attributes and "out_maps" in grad.attributes
    agree(fused, unfused, [], {f"p{i}": a for i, a in enumerate(args)})


# -- what is left unfused, with the same values -------------------------------------------

def _unfused_everywhere(graph, inputs, params, pipeline=GRAD):
    fused, unfused = fused_and_unfused(graph, pipeline)
    assert not any(n.startswith("kernel.attention") for n in names(fused))
    agree(fused, unfused, inputs, params)


def test_an_explicit_mask_is_not_fused():
    _, args = case(causal=False)
    keep = np.tril(np.ones((5, 5), bool), 1)  # not the causal mask: one key ahead too
    graph = build(lambda b, q, k, v: _masked(b, q, k, v, keep), args, {0, 1, 2})
    _unfused_everywhere(graph, [], {f"p{i}": a for i, a in enumerate(args)})


def _masked(b, q, k, v, keep):
    """softmax(q k^T + where(keep, 0, -inf)) v, spelled out."""
    from ember.passes.decompose import softmax, transpose_last

    s = b.op("ember.matmul", q, transpose_last(b, k))
    ninf = b.op("ember.constant", value=np.asarray(-np.inf))
    s = b.op("ember.select", b.op("ember.constant", value=~keep), ninf, s)
    return b.op("ember.matmul", softmax(b, s, 3), v)


def test_probabilities_read_elsewhere_are_not_fused():
    """A user who also returns the attention weights keeps them."""
    from ember.passes.decompose import attention_probs

    _, args = case()

    def probs_too(b, q, k, v):
        p = attention_probs(b, q, k, True, 0.5)
        o = b.op("ember.matmul", p, v)
        return b.op("ember.add", b.op("ember.reduce_sum", o, axes=[3], keepdims=True),
                    b.op("ember.reduce_sum", p, axes=[3], keepdims=True))
    graph = build(probs_too, args, {0, 1, 2})
    _unfused_everywhere(graph, [], {f"p{i}": a for i, a in enumerate(args)})


def test_probabilities_the_graph_returns_are_not_fused():
    """The function's return reads p too (an op with no result of its own)."""
    from ember.ir import Builder, Graph, TensorType
    from ember.passes.decompose import attention_probs

    _, args = case()
    graph = Graph("f", [TensorType(a.shape, "f64") for a in args])
    b = Builder(graph.body)
    q, k, v = graph.args
    p = attention_probs(b, q, k, True, 0.5)
    b.create("func.return", [b.op("ember.matmul", p, v), p])
    _unfused_everywhere(graph, args, {}, "decompose,canonicalize,cse,dce")


def test_a_decomposed_backward_is_not_fused_but_the_forward_still_computes():
    """decompose before autodiff differentiates the softmax op by op: p is read by forms
    that are not the attention rule's, so nothing fuses."""
    fn, args = case()
    graph = build(fn, args, {0, 1, 2})
    _unfused_everywhere(graph, [], {f"p{i}": a for i, a in enumerate(args)},
                        "decompose,autodiff,canonicalize,cse,dce")


def test_a_matmul_that_broadcasts_k_over_the_batch_is_not_fused():
    from ember.passes.decompose import attention_probs

    rng = np.random.default_rng(2)
    args = [rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(1, 3, 5, 4)),
            rng.normal(size=(2, 3, 5, 4))]

    def shared_k(b, q, k, v):
        return b.op("ember.matmul", attention_probs(b, q, k, True, 0.5), v)
    graph = build(shared_k, args, {0, 1, 2})
    _unfused_everywhere(graph, [], {f"p{i}": a for i, a in enumerate(args)},
                        "decompose,canonicalize,cse,dce")
